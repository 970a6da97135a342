"""Folder locks (`zebra.core.locks.FolderLock`): one holder at a time, named to the next; the kernel drops a lock
with its process; a requeued Slurm job waits for its own earlier attempt instead of being refused."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from zebra.core.errors import ZebraError
from zebra.core.locks import FolderLock


def test_a_second_holder_is_refused_naming_the_first(tmp_path, hold_folder):
    pid = hold_folder(tmp_path / "run")
    with pytest.raises(ZebraError, match=rf"run: in use by pid {pid} on \S+, since") as err:
        FolderLock(tmp_path / "run", fix="wait").acquire()
    assert err.value.fix == "wait"
    os.kill(pid, signal.SIGKILL)  # a crash leaves no stale lock
    os.waitpid(pid, 0)
    with FolderLock(tmp_path / "run", fix="wait") as lock:
        assert lock.held and lock.holder()["pid"] == os.getpid()
    assert not lock.held


def test_a_requeued_slurm_job_waits_for_its_earlier_attempt_only(tmp_path, hold_folder, monkeypatch):
    pid = hold_folder(tmp_path / "run", env={"SLURM_JOB_ID": "42"})
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(ZebraError, match="in use by Slurm job 42"):  # another job: refused at once
        FolderLock(tmp_path / "run", fix="").acquire()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    with pytest.raises(ZebraError, match="in use by Slurm job 42"):  # the same job, not restarted: refused
        FolderLock(tmp_path / "run", fix="").acquire()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()  # the earlier attempt ends while it waits
    with FolderLock(tmp_path / "run", fix="") as lock:  # its restart waits until the earlier attempt exits
        assert lock.holder()["slurm_job"] == "42" and lock.holder()["pid"] == os.getpid()


def test_check_names_the_holder_and_takes_nothing(tmp_path, hold_folder):
    """`check` gives acquire's error without taking the lock: a prep asks its question only after it."""
    FolderLock(tmp_path / "new", fix="wait").check()  # nobody holds it, and nothing is created
    assert not (tmp_path / "new").exists()
    pid = hold_folder(tmp_path / "run")
    with pytest.raises(ZebraError, match=rf"run: in use by pid {pid} on \S+, since") as err:
        FolderLock(tmp_path / "run", fix="wait").check()
    assert err.value.fix == "wait"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    FolderLock(tmp_path / "run", fix="wait").check()
    with FolderLock(tmp_path / "run", fix="wait") as lock:  # a check that passed holds nothing
        assert lock.held
        lock.check()  # its own holder is not refused
        with pytest.raises(ZebraError, match=rf"in use by pid {os.getpid()} on"):
            FolderLock(tmp_path / "run", fix="wait").check()


def test_a_forked_child_does_not_keep_the_lock_after_its_parent_is_gone(tmp_path):
    """`zebra data prep` forks its worker pool while it holds the output's lock; after a `kill -9` the workers
    live on until they notice, and a copy of the lock's descriptor in them kept the folder locked for the rerun.
    Here the holder's descriptor is closed without unlocking (what the kernel does when a process dies) while a
    forked child still runs: the folder must be free."""
    import multiprocessing

    lock = FolderLock(tmp_path, fix="wait").acquire()
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    child.start()
    try:
        lock._file.close()  # the parent's end, as at its death: no LOCK_UN
        deadline = time.monotonic() + 10  # the child closes its copy as it starts: let it run first
        while True:
            try:
                FolderLock(tmp_path, fix="wait").acquire().release()
                break
            except ZebraError:
                if time.monotonic() > deadline:  # the child (asleep for 60 s) still holds it
                    raise
                time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
