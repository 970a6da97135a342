"""The README stays true: two commands first, the same test command in CI and nox, and a tour of commands
that exist."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import typer

from zebra.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def _zebra_lines() -> list[str]:
    lines = []
    for block in BLOCKS:
        for line in block.splitlines():
            for part in line.split("&&"):
                part = part.split("  #")[0].strip()
                if part.startswith("zebra "):
                    lines.append(part)
    return lines


def _test_command() -> str:
    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    return " ".join(noxfile.TEST_COMMAND)


def test_readme_opens_with_exactly_two_commands():
    first = [line for line in BLOCKS[0].splitlines() if line.strip()]
    assert len(first) == 2
    assert first[0].startswith("pip install torch==2.13.0 && pip install -e '.[dev]' && zebra ")
    assert README.index("```bash") < README.index("## ")  # before any section


def _ci_readme_command(n: int) -> str:
    """What .ci/run's `readme_command N` reads out of README.md (the function alone, run by bash)."""
    ci = (ROOT / ".ci" / "run").read_text()
    function = re.search(r"^readme_command\(\) \{.*?^\}$", ci, flags=re.S | re.M)[0]
    done = subprocess.run(
        ["bash", "-c", f"{function}\nreadme_command {n}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_ci_and_nox_run_the_readme_commands():
    setup, test_command = [line for line in BLOCKS[0].splitlines() if line.strip()]
    assert test_command == _test_command()
    assert (_ci_readme_command(1), _ci_readme_command(2)) == (setup, test_command)
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'in_fresh bash -c "$(readme_command 1)"' in ci
    assert '"$(readme_command 2)" || rc=$?' in ci


def _resolve(words: list[str]):
    command = typer.main.get_command(app)
    path = []
    for word in words:
        sub = getattr(command, "commands", {}).get(word)
        if sub is None:
            break
        command, path = sub, [*path, word]
    return command, path


@pytest.mark.parametrize("line", _zebra_lines())
def test_every_readme_command_exists(line):
    words = shlex.split(line)[1:]
    command, path = _resolve(words)
    assert path and not hasattr(command, "commands"), (
        f"README mentions `{line}`, but zebra has no such command"
    )


@pytest.mark.parametrize("line", [line for line in _zebra_lines() if line.startswith("zebra recipes")])
def test_readme_recipe_commands_run(line, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli(*shlex.split(line)[1:])
    assert result.exit_code == 0, result.output


def _leaf_commands(command=None, path=()):
    command = command or typer.main.get_command(app)
    for name, sub in getattr(command, "commands", {}).items():
        if hasattr(sub, "commands"):
            yield from _leaf_commands(sub, (*path, name))
        else:
            yield " ".join((*path, name))


@pytest.mark.parametrize("command", sorted(_leaf_commands()))
def test_the_tour_shows_every_command(command):
    shown = {" ".join(_resolve(shlex.split(line)[1:])[1]) for line in _zebra_lines()}
    assert command in shown, f"README.md's tour has no example of `zebra {command}`: add one"
