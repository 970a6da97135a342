"""The checkpoints folder is read below both train/ and convert/: reading a run's checkpoints for conversion
loads no training code (which itself loads conversion code for its export: an import cycle otherwise)."""

from __future__ import annotations

import subprocess
import sys


def test_convert_formats_loads_no_training_module_and_checkpoint_dir_no_torch():
    script = (
        "import sys, zebra.folders.checkpoint_dir\n"
        "print('torch' in sys.modules)\n"
        "import zebra.convert.formats\n"
        "print(sorted(m for m in sys.modules if m.startswith('zebra.train')))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert run.stdout.split("\n")[:2] == ["False", "[]"]


def _checkpoint(folder, step: int, tag: str):
    """A committed-looking checkpoint folder (.metadata, meta.json with `tag`, one shard)."""
    import json

    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"metadata " + tag.encode())
    (folder / "__0_0.distcp").write_bytes(tag.encode() * 1000)
    (folder / "meta.json").write_text(json.dumps({"step": step, "tag": tag}))
    return folder


def test_a_reader_waiting_while_its_step_is_replaced_holds_the_new_folder(tmp_path, monkeypatch):
    """A reader that opened step_X as a save of the same step was replacing it used to get the lock on the old,
    renamed folder and then read the new one by name, unprotected: it now holds the folder its name leads to."""
    import fcntl
    import os
    import threading

    from zebra.folders import checkpoint_dir as cd

    final = _checkpoint(tmp_path / "checkpoints" / "step_0000002", 2, "old")
    new = _checkpoint(tmp_path / "checkpoints" / "step_0000002.partial", 2, "new")
    real_flock, reader_locks = fcntl.flock, threading.Event()

    def flock(fd, op):
        if op == fcntl.LOCK_SH:
            reader_locks.set()  # the reader has opened the old folder and now waits for it
        return real_flock(fd, op)

    monkeypatch.setattr(cd.fcntl, "flock", flock)
    saver = os.open(final, os.O_RDONLY | os.O_DIRECTORY)
    real_flock(saver, fcntl.LOCK_EX)  # as commit_step holds it while it swaps the folders
    got: list[int | None] = []
    reader = threading.Thread(target=lambda: got.append(cd.read_hold(final)))
    reader.start()
    try:
        assert reader_locks.wait(60)
        final.rename(final.with_name("step_0000002.replaced"))
        new.rename(final)
    finally:
        os.close(saver)
    reader.join(60)
    (fd,) = got
    try:
        assert os.fstat(fd).st_ino == final.stat().st_ino
        assert cd.read_meta(final)["tag"] == "new"
        assert not cd.remove_unless_held(final)  # and it is held: pruning skips it
    finally:
        os.close(fd)
    assert cd.remove_unless_held(final) and not final.exists()


def test_the_newest_pruned_before_it_was_held_is_listed_again(tmp_path):
    """Between listing a live run's checkpoints and holding them, the run may save and prune the one listed
    first: `held` lists them again and holds the newest, instead of falling back to an older one."""
    from zebra.folders.checkpoint_dir import committed, held, remove_unless_held

    ck = tmp_path / "checkpoints"
    _checkpoint(ck / "step_0000002", 2, "a")
    _checkpoint(ck / "step_0000004", 4, "b")
    listings = []

    def list_them():
        found = committed(ck)
        listings.append([p.name for p in found])
        if len(listings) == 1:  # the run saves step 6 and prunes (keep_last=1) before the holds
            _checkpoint(ck / "step_0000006", 6, "c")
            for old in committed(ck)[1:]:
                remove_unless_held(old)
        return found

    with held(list_them) as found:
        assert [p.name for p in found] == ["step_0000006"]
        assert not remove_unless_held(ck / "step_0000006")
    assert listings == [["step_0000004", "step_0000002"], ["step_0000006"]]
    assert remove_unless_held(ck / "step_0000006")
