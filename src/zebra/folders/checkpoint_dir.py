"""A checkpoints folder on disk, read without torch: step folder names, which checkpoints are committed and
in which order to try them, and each one's `meta.json`. Training writes these folders (`zebra.train.checkpoint`)
and conversion reads them (`zebra.convert.formats`); both import this module, not each other.

    <run>/checkpoints/step_0000100/   .metadata (DCP), meta.json (step, consumed samples, ...), rng/, shards
    <run>/checkpoints/latest          the name of the newest committed checkpoint

    committed(run / "checkpoints")    # [step_0000100, step_0000050]: complete ones, `latest` first
    read_meta(found[0])["step"]       # 100

Every reader of a run's checkpoint (`zebra convert` and `verify`, the export that eval, chat and generate make of
a run folder, `zebra train --resume` of another run) holds the step folder it reads with `read_hold` (or
`held`), a shared `flock` on the folder itself. The writers take the exclusive side: keep_last pruning removes a
folder only through `remove_unless_held`, which skips a held one (it goes at a later save, once released); a
save of a step already there (`commit_step`) waits for its readers before it replaces the folder; starting a run
over (`remove_checkpoints`) refuses while one is read. The kernel drops a hold when its process exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from zebra.core.errors import ZebraError

_STEP_DIR = re.compile(r"step_(\d+)")
_HOLD_TRIES = 20  # a checkpoint replaced (read_hold), or the newest pruned (held), this many times running


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
    """Hold checkpoint `path` for reading, so that pruning leaves it alone (`remove_unless_held`) and a save of
    the same step waits (`commit_step`).

    Returns the descriptor to `os.close` once done, or None when `path` is gone or no longer complete (pruned
    meanwhile: the caller takes the next `latest`). A folder replaced under the same name while this waited is
    not the one held: the new one is held instead. Where the file system has no locks, nothing is held.
    """
    for _ in range(_HOLD_TRIES):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None
        with contextlib.suppress(OSError):  # no locks on this file system: read unprotected, as before
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a pruner removes it or a save replaces it
        mine, there = _identity(fd), _identity(path)
        if mine == there and is_complete(path):
            return fd  # held: nobody removes or replaces it until the descriptor is closed
        os.close(fd)
        if there is None or there == mine:
            return None  # removed, or never completed
        # replaced by a save of the same step while this waited: hold the new folder
    return None


def _identity(target: Path | int) -> tuple[int, int] | None:
    """(device, inode) of a path or an open descriptor; None when it is gone."""
    try:
        st = os.fstat(target) if isinstance(target, int) else os.stat(target)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def held(list_them: Callable[[], list[Path]]) -> Iterator[list[Path]]:
    """The checkpoints `list_them()` names, each held for reading (`read_hold`) until the block ends.

    Those removed before they could be held are left out. When the first (newest) one was removed, a live run
    pruned it after saving newer ones: the checkpoints are listed again, so that the newest is read.
    """
    fds: list[int] = []
    try:
        for attempt in range(_HOLD_TRIES):
            listed = list_them()
            kept = []
            for path in listed:
                if (fd := read_hold(path)) is not None:
                    fds.append(fd)
                    kept.append(path)
            if kept[:1] == listed[:1] or attempt == _HOLD_TRIES - 1:
                break
            while fds:
                os.close(fds.pop())
        yield kept
    finally:
        for fd in fds:
            os.close(fd)


def remove_unless_held(path: Path) -> bool:
    """Delete checkpoint folder `path` unless a reader holds it (`read_hold`); True when it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        if not _exclusive_now(fd):
            return False  # a reader holds it: a later save prunes it
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def _exclusive_now(fd: int) -> bool:
    """Take the writer's (exclusive) side of folder `fd`'s lock without waiting: False when a reader holds it
    (`read_hold`); True once taken, or where the file system has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        pass  # no locks on this file system
    return True


READERS = "zebra convert, verify, eval, chat or generate of this run, or a run resuming from it"


def commit_step(partial: Path, final: Path, *, on_wait: Callable[[str], None] | None = None) -> None:
    """Rename the checkpoint written at `partial` to its name `final`.

    A checkpoint already at `final` (the same step saved again: a run that resumed from an older step, or
    started over) is replaced only once no reader holds it: `on_wait` is told when one does, and the save waits
    for it to finish, so that no reader sees a half-replaced folder. The old folder is renamed aside
    (`step_XXXXXXX.replaced`) before the new one takes its name, then deleted.
    """
    try:
        fd = os.open(final, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        partial.rename(final)
        return
    aside = final.with_name(final.name + ".replaced")
    try:
        if not _exclusive_now(fd):
            if on_wait is not None:
                on_wait(f"{final} is being read ({READERS}): waiting for it to finish before replacing it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)  # a reader waiting for `final` finds another folder under its name and holds that
        partial.rename(final)
    finally:
        os.close(fd)
    shutil.rmtree(aside, ignore_errors=True)


def recover_interrupted_commit(checkpoints: Path) -> list[str]:
    """Put back the checkpoints a `commit_step` stopped between its two renames left without their name: the new
    copy (`step_X.partial`, complete: the old copy is set aside only after it was written and synced) when its
    meta.json reads, else the old one (`step_X.replaced`). Call it only where no save of this run can be running
    (the run's own trainer before it resumes or saves). Returns the names put back."""
    recovered = []
    for aside in sorted(checkpoints.glob("step_*.replaced")):
        final = aside.with_name(aside.name.removesuffix(".replaced"))
        if final.exists():
            continue  # the commit finished: the old copy is stale (the next prune deletes it)
        partial = final.with_name(final.name + ".partial")
        try:
            read_meta(partial)
            ready = is_complete(partial)
        except (OSError, ValueError):
            ready = False
        (partial if ready else aside).rename(final)
        recovered.append(final.name)
    return recovered


def remove_checkpoints(checkpoints: Path) -> None:
    """Delete a run's `checkpoints/` folder (the run starts over), or raise a ZebraError naming a checkpoint that
    a reader holds (then nothing is deleted)."""
    fds: list[int] = []
    try:
        for path in sorted(checkpoints.glob("step_*")):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue  # a file, or gone
            fds.append(fd)
            if not _exclusive_now(fd):
                raise ZebraError(
                    f"{path}: being read ({READERS})",
                    fix="wait for it to finish, then start the run over again",
                )
        shutil.rmtree(checkpoints, ignore_errors=True)
    finally:
        for fd in fds:
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
