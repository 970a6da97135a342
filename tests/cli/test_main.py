"""The root command: version, help, shell completion, and how errors reach the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from zebra import __version__
from zebra.recipes.loader import builtin_dir


def test_version(zebra):
    for flag in ("--version", "-V"):
        r = zebra(flag)
        assert r.returncode == 0 and r.stdout == f"zebra {__version__}\n"


def test_help_lists_every_command_with_its_summary(zebra):
    import typer

    from zebra.cli.main import app

    r = zebra("--help")
    assert r.returncode == 0
    assert "Usage: zebra [OPTIONS] COMMAND [ARGS]..." in r.stdout
    assert "Train, convert, verify, evaluate and chat" in r.stdout
    for flag in ("--version", "-V", "--install-completion", "--help", "-h"):
        assert f" {flag} " in r.stdout
    commands = typer.main.get_command(app).commands
    assert len(commands) >= 12
    for name, command in commands.items():
        summary = (command.short_help or command.help).split("\n\n")[0]
        assert f" {name} " in r.stdout and " ".join(summary.split()[:4]) in r.stdout, name


def test_no_arguments_shows_help(zebra):
    r = zebra()
    assert "Usage: zebra" in r.stdout + r.stderr


def test_unknown_command_is_a_usage_error(zebra):
    r = zebra("recipez")
    assert r.returncode == 2
    assert "No such command 'recipez'" in r.stderr and "Traceback" not in r.stderr


def test_show_completion_prints_a_bash_script(zebra):
    r = zebra("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert r.returncode == 0
    assert "_zebra_completion()" in r.stdout
    assert "_ZEBRA_COMPLETE=complete_bash" in r.stdout
    assert "complete -o default -F _zebra_completion zebra" in r.stdout


def test_completion_completes_commands_and_recipe_names(zebra):
    env = {"_ZEBRA_COMPLETE": "complete_bash", "COMP_WORDS": "zebra rec", "COMP_CWORD": "1"}
    assert zebra(env=env).stdout.split() == ["recipes"]
    env = {"_ZEBRA_COMPLETE": "complete_bash", "COMP_WORDS": "zebra recipes show tiny-", "COMP_CWORD": "3"}
    expected = sorted(p.stem for p in builtin_dir().glob("tiny-*.yaml"))
    assert len(expected) >= 3 and zebra(env=env).stdout.split() == expected


def test_install_completion_writes_the_shell_setup(zebra, tmp_path):
    env = {"HOME": str(tmp_path), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    r = zebra("--install-completion", "bash", env=env)
    assert r.returncode == 0, r.stderr
    script = tmp_path / ".bash_completions" / "zebra.sh"
    assert "_zebra_completion" in script.read_text()
    assert str(Path(".bash_completions") / "zebra.sh") in (tmp_path / ".bashrc").read_text()


def test_unexpected_errors_are_one_line_with_a_debug_hint(cli, monkeypatch):
    import zebra.recipes

    def broken(*_args, **_kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(zebra.recipes, "list_recipes", broken)
    result = cli("recipes", "list")
    assert result.exit_code == 1
    assert "error: RuntimeError: disk on fire" in result.stderr
    assert "ZEBRA_DEBUG=1" in result.stderr
    assert "Traceback" not in result.output


def test_a_table_written_to_a_pipe_is_not_folded_to_80_columns():
    """Piped or logged output (no terminal, no COLUMNS) gets 160 columns: a row of `zebra recipes list` stays on
    one line instead of its cells folding mid-word at Rich's default 80."""
    import os
    import subprocess
    import sys

    from tests.cli.conftest import ENTRY

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-c", ENTRY, "recipes", "list"], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=120)  # fmt: skip
    assert r.returncode == 0
    row = next(line for line in r.stdout.splitlines() if "1b-gdn-pure" in line)
    assert "Pure Gated DeltaNet 1.2B" in row and "meta-llama/Llama-3.2-1B" in row
    assert 80 < max(len(line) for line in r.stdout.splitlines()) <= 160


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_a_narrow_terminal_drops_the_optional_columns_instead_of_folding_names(columns):
    """At 80 columns `zebra recipes list` folded recipe and tokenizer names mid-word (`meta-llama/Llama-3.2-1` /
    `B`). Names stay whole now: the description column goes first, then the tokenizer's, and the description
    wraps between words where it stays."""
    import os
    import subprocess
    import sys

    from tests.cli.conftest import ENTRY

    r = subprocess.run([sys.executable, "-c", ENTRY, "recipes", "list"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": str(columns)}, stdin=subprocess.DEVNULL, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    header = lines[1]
    assert ("model" in header) == (columns >= 100) and ("tokenizer" in header) == (columns >= 80)
    at = next(i for i, line in enumerate(lines) if "1b-mamba-mla" in line)
    row = lines[at]
    described = " ".join(
        [row, *(line for line in lines[at + 1 : at + 3] if line.split("│")[1].strip() == "")]
    )
    assert "12 Mamba2+4" in row and "MLA" in described and "1.29B" in row  # wrapped between words
    if columns >= 80:
        assert "meta-llama/Llama-3.2-1B" in row


def test_a_table_written_to_a_reader_that_left_ends_quietly():
    """Rich's output, like `zebra generate`'s, ends with the SIGPIPE status when stdout's reader has gone."""
    import os
    import subprocess
    import sys

    from tests.cli.conftest import ENTRY

    read_end, write_end = os.pipe()
    os.close(read_end)
    r = subprocess.run([sys.executable, "-c", ENTRY, "recipes", "list"], stdout=write_end, stderr=subprocess.PIPE,
                       text=True, stdin=subprocess.DEVNULL, timeout=120)  # fmt: skip
    os.close(write_end)
    assert (r.returncode, r.stderr) == (141, "")


@pytest.mark.parametrize("kind", ["warn", "error", "hint"])
def test_a_long_message_on_a_piped_stderr_stays_one_line(kind, capsys, monkeypatch):
    """A log or `2> file` keeps each warning, error and hint on one line (grep finds it whole)."""
    from zebra.cli._output import Output

    monkeypatch.delenv("COLUMNS", raising=False)
    message = " ".join(f"word{i}" for i in range(40))  # about 270 characters
    getattr(Output(), kind)(message)
    assert capsys.readouterr().err.splitlines()[0].endswith(message)
