"""Shared pieces of the launcher tests (fixtures are in conftest.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

# A few seconds of training per rank: startup (imports) dominates every launcher test.
STEPS = 10
SETS = [
    "data.seq_len=32", "train.global_batch_size=4", "train.micro_batch_size=2", "train.log_interval=1",
    "train.eval_interval=0", "train.save_interval=2", "train.export=false",
]  # fmt: skip
TINY = ["tiny", "--mock-data", "--max-steps", str(STEPS), *(a for s in SETS for a in ("--set", s))]


def hostbind_flags(image) -> list[str]:
    """The test image's read-only binds (host /usr, /etc, Python) as `zebra train` flags."""
    flags = ["--image", image.name, "--set", f"launch.container_python={image.python}"]
    # The image's /sbin is a link into the bound /usr, where docker cannot place its init binary.
    flags += ["--set", "launch.container_init=false"]
    for source, bind in image.volumes.items():
        flags += ["--mount", f"{source}:{bind['bind']}:{bind['mode']}"]
    return flags


def losses(run_dir: Path) -> list[tuple[int, float]]:
    from zebra.train.metrics import read_metrics

    return [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]


def recording(tmp_path: Path, *commands: str) -> tuple[dict[str, str], Callable[[str], list[str]]]:
    """(`PATH` with each of `commands` wrapped, `calls(command)`): the wrapper records its arguments (one line a
    call, `calls` reads them) and, in `COMMAND.env`, the environment it was started with, then runs the real one."""
    shims = tmp_path / "recording-bin"
    shims.mkdir(exist_ok=True)
    for command in commands:
        real = shutil.which(command)
        assert real, f"{command} is not on PATH"
        log = shims / f"{command}.calls"
        (shims / command).write_text(
            f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nenv -0 > {shims / command}.env\nexec {real} "$@"\n'
        )
        (shims / command).chmod(0o755)

    def calls(command: str) -> list[str]:
        log = shims / f"{command}.calls"
        return log.read_text().splitlines() if log.exists() else []

    return {"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}, calls


def started_with(tmp_path: Path, command: str) -> dict[str, str]:
    """The environment the last call of a `recording` wrapper of `command` started with."""
    raw = (tmp_path / "recording-bin" / f"{command}.env").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)
