"""Durable replacement: write_atomic leaves the old or the new text, and flushes the file and its folder."""

from __future__ import annotations

import os

import pytest

from zebra.atomic import fsync_tree, write_atomic


@pytest.fixture
def flushed(monkeypatch):
    """The paths os.fsync is called on, in order (named through /proc: Linux)."""
    paths = []
    real = os.fsync

    def fsync(fd):
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


def test_write_atomic_replaces_the_text_and_flushes_file_then_folder(tmp_path, flushed):
    target = tmp_path / "latest"
    target.write_text("step_0000010\n")
    write_atomic(target, "step_0000020\n")
    assert target.read_text() == "step_0000020\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # no temporary file left
    assert flushed == [str(tmp_path / ".latest.tmp"), str(tmp_path)]


def test_fsync_tree_flushes_every_file_and_folder(tmp_path, flushed):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"1")
    (tmp_path / "y.json").write_text("{}")
    fsync_tree(tmp_path)
    assert set(flushed) == {
        str(tmp_path),
        str(tmp_path / "a"),
        str(tmp_path / "a" / "x.bin"),
        str(tmp_path / "y.json"),
    }
