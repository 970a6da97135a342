"""A checkpoints folder on disk, read without torch: step folder names, which checkpoints are committed and
in which order to try them, and each one's `meta.json`. Training writes these folders (`zebra.train.checkpoint`)
and conversion reads them (`zebra.convert.formats`); both import this module, not each other.

    <run>/checkpoints/step_0000100/   .metadata (DCP), meta.json (step, consumed samples, ...), rng/, shards
    <run>/checkpoints/latest          the name of the newest committed checkpoint

    committed(run / "checkpoints")    # [step_0000100, step_0000050]: complete ones, `latest` first
    read_meta(found[0])["step"]       # 100

A reader (`zebra convert` of a live run) holds the checkpoint it reads with `read_hold`, a shared `flock` on the
step folder itself; the trainer's keep_last pruning removes a folder only through `remove_unless_held`, which
skips a held one (it goes at a later save, once released). The kernel drops a hold when its process exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from zebra.errors import ZebraError

_STEP_DIR = re.compile(r"step_(\d+)")


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def is_complete(path: Path) -> bool:
    """A committed checkpoint: DCP metadata and our meta.json are both present."""
    return (path / ".metadata").is_file() and (path / "meta.json").is_file()


def read_meta(path: Path) -> dict[str, Any]:
    """The `meta.json` of checkpoint `path`.

    Raises:
        ValueError: the file is empty, not JSON, or holds no step (a torn or corrupt checkpoint).
    """
    file = path / "meta.json"
    meta = json.loads(file.read_text())
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        raise ValueError(f"{file}: no step recorded")
    return meta


def newest_step(found: list[Path]) -> int | None:
    """The step of the first checkpoint of `found` whose meta.json is readable (the one a restore tries first)."""
    for path in found:
        try:
            return read_meta(path)["step"]
        except (OSError, ValueError):
            continue
    return None


def committed(checkpoints: Path) -> list[Path]:
    """Complete checkpoints under `checkpoints/`, newest first, the one `latest` names leading."""
    if not checkpoints.is_dir():
        return []
    found = [p for p in checkpoints.iterdir() if _STEP_DIR.fullmatch(p.name) and is_complete(p)]
    found.sort(key=lambda p: int(_STEP_DIR.fullmatch(p.name).group(1)), reverse=True)
    pointer = checkpoints / "latest"
    if pointer.is_file():
        name = pointer.read_text().strip()
        found.sort(key=lambda p: p.name != name)  # stable: `latest` first, the rest stay newest-first
    return found


def read_hold(path: Path) -> int | None:
    """Hold checkpoint `path` for reading, so that pruning leaves it alone (`remove_unless_held`).

    Returns the descriptor to `os.close` once done, or None when `path` is gone or no longer complete (pruned
    meanwhile: the caller takes the next `latest`). Where the file system has no locks, nothing is held.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    with contextlib.suppress(OSError):  # no locks on this file system: read unprotected, as before
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a pruner is removing it
    if is_complete(path):
        return fd
    os.close(fd)
    return None


def remove_unless_held(path: Path) -> bool:
    """Delete checkpoint folder `path` unless a reader holds it (`read_hold`); True when it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a reader holds it: a later save prunes it
        except OSError:
            pass  # no locks on this file system
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def find_checkpoints(source: str | Path, run_dir: Path) -> list[Path]:
    """Checkpoints to try, in order, for `--resume auto` (this run) or `--resume PATH`.

    PATH may be one checkpoint (`.../step_0000100`), a `checkpoints/` folder or a run directory.
    """
    if str(source) == "auto":
        return committed(run_dir / "checkpoints")
    path = Path(source)
    if (path / ".metadata").is_file():
        if not is_complete(path):
            raise ZebraError(
                f"--resume {path}: incomplete checkpoint (no meta.json)", fix="pick another step"
            )
        return [path]
    for folder in (path / "checkpoints", path):
        if folder.is_dir() and (found := committed(folder)):
            return found
    raise ZebraError(
        f"--resume {path}: no checkpoint there",
        fix="pass a run directory, its checkpoints/ or a step_XXXXXXX",
    )
