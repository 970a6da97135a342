"""Durable replacement: write_atomic leaves the old or the new text, and flushes the file and its folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zebra.core.atomic import fsync_tree, write_atomic


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


@pytest.fixture(scope="module")
def trained_tiny_run(tmp_path_factory):
    """The session's tiny training run (tests/generation/conftest.py)."""
    from tests.generation.conftest import trained_tiny_run as made_once

    return made_once(tmp_path_factory.getbasetemp())


@pytest.mark.parametrize(
    "args",
    [
        ["train", "tiny", "--yes", "--output", "{blocker}"],  # the run folder under it: the run lock makes it
        [
            "data",
            "prep",
            "--source",
            "{corpus}",
            "--tokenizer",
            "byte",
            "--output",
            "{blocker}/data",
            "--yes",
        ],
        ["convert", "{run}", "--output", "{blocker}/export"],
        ["plot", "{run}", "-o", "{blocker}/loss.png"],
        ["recipes", "cp", "tiny", "{blocker}/mine.yaml"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_an_output_under_a_file_is_one_line_naming_the_file(tmp_path, args, trained_tiny_run):
    """An output folder whose place a file takes (or whose parent is a file): every command that writes one
    names that file, instead of reporting FileExistsError / NotADirectoryError as a bug."""
    from typer.testing import CliRunner

    from zebra.cli.main import app

    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text('{"text": "hello"}\n')
    argv = [a.format(blocker=blocker, corpus=corpus, run=trained_tiny_run) for a in args]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert f"cannot be a folder, {blocker} is a file" in result.stderr and "bug" not in result.stderr
    assert blocker.read_text() == "a file\n"


def test_make_folder_names_the_file_in_the_way(tmp_path):
    from zebra.core.atomic import make_folder
    from zebra.core.errors import ZebraError

    (tmp_path / "f").write_text("")
    make_folder(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    for target in (tmp_path / "f", tmp_path / "f" / "g" / "h"):
        with pytest.raises(ZebraError, match=rf"{target}: cannot be a folder, {tmp_path / 'f'} is a file"):
            make_folder(target)


def test_make_folder_says_why_a_folder_cannot_be_made():
    """/proc takes no new folders (a permission error would do, but the tests may run as root): one line with the
    reason, not an OSError taken for a bug."""
    from zebra.core.atomic import make_folder
    from zebra.core.errors import ZebraError

    with pytest.raises(ZebraError, match=r"/proc/zebra-test/run: cannot create this folder \(.+\)") as e:
        make_folder(Path("/proc/zebra-test/run"))
    assert "choose another place" in e.value.fix
