"""Exclusive folder locks: one writer at a time for a run directory (`RUN/.lock`) or a data folder
(`FOLDER/.lock`).

    with FolderLock(run_dir, fix="wait for it to end, or pass --run NAME"):
        ...                                  # nobody else holds run_dir/.lock meanwhile
    FolderLock(folder, fix=...).check()      # the same error when another holds it, taking and writing nothing

A lock is an `flock` on the folder's `.lock` file. The kernel drops it when its process exits, however it
exits, so a crash leaves no stale lock; the file itself stays. A forked child (a worker pool) closes its copy of
the lock's descriptor at once: the lock belongs to the open file, which a child's copy would keep locked after a
`kill -9` of its parent until the child noticed and ended. The holder writes who it is into the file (pid,
host, Slurm job), and a second process gets a one-line ZebraError naming it.

A requeued Slurm job (SLURM_RESTART_COUNT > 0) may start while its earlier attempt still holds the lock (it is
saving a checkpoint, or its node's lock has not timed out yet): a holder of the same job is waited for, up to
`REQUEUE_WAIT_S`, instead of refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from zebra.core.atomic import make_folder
from zebra.core.errors import ZebraError

LOCK_NAME = ".lock"
REQUEUE_WAIT_S = 900.0
POLL_S = 1.0
_HELD: set[IO[str]] = set()  # the lock files this process holds open


def _close_held_in_child() -> None:
    """In a forked child: close the inherited lock descriptors (a close, not LOCK_UN, which would unlock the
    parent's lock too)."""
    for file in _HELD:
        with contextlib.suppress(OSError):
            file.close()
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


def _holder_record() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def describe_holder(record: dict[str, Any] | None) -> str:
    """`Slurm job 42 (pid 7 on node1, since ...)`, `pid 7 on host (since ...)`, or `another process`."""
    if not record:
        return "another process"
    where = f"pid {record.get('pid')} on {record.get('host')}, since {record.get('since')}"
    job = record.get("slurm_job")
    return f"Slurm job {job} ({where})" if job else where


class FolderLock:
    """An exclusive lock on `folder` (created if missing) for this process.

    Args:
        folder: the folder to lock; the lock file is `folder/.lock`.
        fix: what to do when another process holds it (the ZebraError's fix).
    """

    def __init__(self, folder: str | Path, *, fix: str):
        self.folder, self.fix = Path(folder), fix
        self.path = self.folder / LOCK_NAME
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> FolderLock:
        """Take the lock, or raise a ZebraError naming its holder (a requeued job waits for its own attempt)."""
        if self._file is not None:
            return self
        make_folder(self.folder)
        file = open(self.path, "a+")  # noqa: SIM115 (held open for as long as the lock is)
        deadline = time.monotonic() + REQUEUE_WAIT_S
        while True:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = self.holder()
                if not (_own_earlier_attempt(holder) and time.monotonic() < deadline):
                    file.close()
                    raise ZebraError(
                        f"{self.folder}: in use by {describe_holder(holder)}", fix=self.fix
                    ) from None
                time.sleep(POLL_S)
        file.seek(0)
        file.truncate()
        file.write(json.dumps(_holder_record()) + "\n")
        file.flush()
        self._file = file
        _HELD.add(file)
        return self

    def check(self) -> None:
        """Raise the ZebraError `acquire` would (another process holds the lock), without taking the lock or
        creating anything: for a command that asks a question before it starts, so that the error comes first.
        The lock is only looked at; `acquire` may still find it taken later."""
        if self._file is not None:
            return
        try:
            file = open(self.path)  # noqa: SIM115 (closed below, which drops the test lock)
        except OSError:
            return  # no lock file: nobody holds it
        with file:
            try:
                fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a holder's exclusive lock refuses it
            except BlockingIOError:
                holder = self.holder()
                if not _own_earlier_attempt(holder):  # acquire waits for that one
                    raise ZebraError(
                        f"{self.folder}: in use by {describe_holder(holder)}", fix=self.fix
                    ) from None
            except OSError:
                pass  # no locks on this file system

    def holder(self) -> dict[str, Any] | None:
        """Who holds (or last held) the lock, as its holder recorded it; None when unknown."""
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(self.path.read_text() or "null")
            return record if isinstance(record, dict) else None
        return None

    def release(self) -> None:
        if self._file is not None:
            _HELD.discard(self._file)
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _own_earlier_attempt(holder: dict[str, Any] | None) -> bool:
    """The holder is an earlier attempt of this requeued Slurm job."""
    job = os.environ.get("SLURM_JOB_ID")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    return bool(job and restarts and holder and holder.get("slurm_job") == job)
