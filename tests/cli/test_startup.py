"""`zebra --help`, `--version` and `recipes list` import no heavy library (no timings here: see
`zebra bench startup` and docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import typer

from zebra.bench.startup import HEAVY_MODULES, heavy_imports, imported_modules
from zebra.cli.main import app
from zebra.launch.devices import host_gpus


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["recipes", "list"], ["recipes", "--help"]])
def test_light_commands_import_no_heavy_module(args):
    assert heavy_imports(args) == []


def _command_paths(command=None, path=()):
    command = command or typer.main.get_command(app)
    for name, sub in getattr(command, "commands", {}).items():
        yield [*path, name]
        yield from _command_paths(sub, (*path, name))


@pytest.mark.parametrize("path", list(_command_paths()), ids=" ".join)
def test_every_command_help_is_light(path):
    assert heavy_imports([*path, "--help"]) == []


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "{missing}"],
        ["chat", "{missing}"],
        ["generate", "{missing}", "--prompt", "hi"],
        ["convert", "{missing}"],
        ["verify", "{missing}"],
        ["verify", "{here}", "--against", "{missing}"],
        ["train", "no-such-recipe"],
        ["train", "tiny", "--set", "train.no_such_key=1"],
        ["train", "tiny", "--set", "train.optimizer_graph=true", "--nproc", "1"],
        ["bench", "train", "no-such-recipe"],
        ["bench", "train", "tiny", "--set", "train.no_such_key=1"],
        ["bench", "decode", "{missing}"],
    ],
    ids=lambda args: " ".join(a for a in args if not a.startswith("{")),
)
def test_a_bad_argument_is_told_before_any_heavy_import(args, tmp_path):
    """A mistyped MODEL / SOURCE / --against, recipe or --set key, or a lever this machine cannot run, is told
    (exit 1) before torch and transformers are imported (seconds): the commands check their arguments first."""
    argv = [a.format(missing=tmp_path / "nope", here=tmp_path) for a in args]
    modules = imported_modules(argv, ok_exit_codes=(1,))
    assert sorted({m.split(".")[0] for m in modules} & set(HEAVY_MODULES)) == []


@pytest.mark.skipif(
    host_gpus() != (None, 0), reason="torch counts the GPUs of a machine that has a GPU driver"
)
def test_a_dry_run_on_a_machine_without_gpus_imports_no_heavy_module(tmp_path):
    """The plan needs this machine's GPU count: without a GPU driver's device files it is 0, told without torch."""
    args = ["train", "tiny", "--mock-data", "--dry-run", "--output", str(tmp_path)]
    assert sorted({m.split(".")[0] for m in imported_modules(args)} & set(HEAVY_MODULES)) == []


def test_the_detector_sees_a_heavy_import(tmp_path):
    # `zebra doctor` asks torch about GPUs, so it must show up: proof the check above can fail.
    modules = imported_modules(["doctor", "--json", "--data-dir", str(tmp_path)], ok_exit_codes=(0, 1))
    assert "torch" in {m.split(".")[0] for m in modules}
    assert set(HEAVY_MODULES) >= {"torch", "transformers", "fla", "megatron", "datasets", "lm_eval"}


def test_root_help_skips_typers_full_help_renderer():
    """`zebra --help` is drawn by zebra.cli._help: Typer's renderer imports markdown-it, pygments and attrs,
    about half of what the root help used to cost (docs/benchmarks.md)."""
    modules = set(imported_modules(["--help"]))
    assert "zebra.cli._help" in modules
    assert not modules & {"typer.rich_utils", "rich.markdown", "rich.syntax", "rich.traceback"}
    assert "typer.rich_utils" in imported_modules(["recipes", "--help"])  # subcommands keep Typer's
