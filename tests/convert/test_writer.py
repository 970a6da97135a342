"""The sharded safetensors writer and the temp-then-rename output folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from zebra.convert.writer import TensorSpec, output_dir, parse_size, plan_shards, write_safetensors
from zebra.core.errors import ZebraError


def test_parse_size():
    assert parse_size("5GB") == 5_000_000_000
    assert parse_size("2GiB") == 2 * 1024**3
    assert parse_size("500 MB") == 500_000_000
    assert parse_size(123) == 123
    with pytest.raises(ZebraError, match="not a size"):
        parse_size("big")


def test_shards_respect_the_limit_and_keep_order():
    specs = [TensorSpec(f"t{i}", (10,), torch.float32) for i in range(7)]  # 40 bytes each
    shards = plan_shards(specs, 100)
    assert [[s.name for s in shard] for shard in shards] == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"], ["t6"]]
    assert plan_shards([TensorSpec("huge", (1000,), torch.float32)], 100)[0][0].name == "huge"


def test_written_files_load_with_safetensors_and_cast_dtypes(tmp_path):
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.arange(7, dtype=torch.int64),
        "c": torch.randn(2, 2, dtype=torch.float64),
        "flag": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
    }
    specs = [
        TensorSpec(k, tuple(v.shape), torch.bfloat16 if k == "a" else v.dtype) for k, v in tensors.items()
    ]
    names = write_safetensors(tmp_path, specs, tensors.__getitem__, max_shard_bytes=40)
    loaded = {}
    for name in names:
        loaded.update(load_file(tmp_path / name))
    assert loaded.keys() == tensors.keys()
    assert torch.equal(loaded["a"], tensors["a"].to(torch.bfloat16))
    for k in ("b", "c", "flag", "scalar"):
        assert loaded[k].dtype == tensors[k].dtype and torch.equal(loaded[k], tensors[k])
    assert (tmp_path / "model.safetensors.index.json").is_file()


def test_progress_reports_bytes_written_after_each_tensor(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int64), "c": torch.randn(4)}
    specs = [
        TensorSpec(k, tuple(v.shape), torch.float16 if k == "a" else v.dtype) for k, v in tensors.items()
    ]
    calls = []
    write_safetensors(
        tmp_path, specs, tensors.__getitem__, max_shard_bytes=40, on_progress=lambda *a: calls.append(a)
    )
    total = 15 * 2 + 7 * 8 + 4 * 4  # on-disk bytes: "a" is written as float16
    assert calls == [(30, total, "a"), (86, total, "b"), (102, total, "c")]


def test_output_dir_removes_its_temp_folder_on_error_and_keeps_the_old_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"old": true}')  # a model folder: --force may replace it
    with pytest.raises(RuntimeError), output_dir(out, force=True) as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "config.json").read_text() == '{"old": true}'


def test_output_dir_never_replaces_a_folder_that_is_not_a_model(tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    (out / "shard.bin").write_bytes(b"tokens")
    with pytest.raises(ZebraError, match=r"no config\.json"), output_dir(out, force=True):
        pass  # not reached
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no temporary folder either
    assert (out / "shard.bin").read_bytes() == b"tokens"


def test_output_dir_cleans_folders_left_by_killed_runs(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".out.tmp-{int(dead.stdout)}"
    stale.mkdir()
    live = tmp_path / f".out.tmp-{os.getppid()}"  # a running process's folder is left alone
    live.mkdir()
    with output_dir(tmp_path / "out", force=False) as tmp:
        (tmp / "done").write_text("1")
    assert not stale.exists() and live.exists()
    assert (tmp_path / "out" / "done").is_file()


def _dead_pid():
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(dead.stdout)


@pytest.mark.parametrize("replaced", [False, True])
def test_an_old_output_set_aside_by_a_killed_force_run_comes_back_or_goes(tmp_path, replaced):
    """Killed between `out -> .out.old-PID` and `.tmp -> out`: no output was left, and the copy never went."""
    old = tmp_path / f".out.old-{_dead_pid()}"
    old.mkdir()
    (old / "config.json").write_text('{"old": true}')
    out = tmp_path / "out"
    if replaced:  # the new output did arrive (or someone made one since): the set-aside copy is stale
        out.mkdir()
        (out / "config.json").write_text('{"new": true}')
    with pytest.raises(ZebraError, match="already exists"), output_dir(out, force=False):
        pass  # not reached: the output is back, and replacing it needs force
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "config.json").read_text() == ('{"new": true}' if replaced else '{"old": true}')


def test_an_output_another_process_made_meanwhile_is_not_replaced_without_force(tmp_path):
    """Two converts into one new output both passed the check at the start; the second replaced the first."""
    out = tmp_path / "out"
    with pytest.raises(ZebraError, match="another process created it"), output_dir(out, force=False) as tmp:
        (tmp / "config.json").write_text('{"second": true}')
        out.mkdir()
        (out / "config.json").write_text('{"first": true}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "config.json").read_text() == '{"first": true}'


@pytest.mark.parametrize("size", ["0", "0GB", 0, -1])
def test_a_shard_size_below_one_byte_is_refused(size):
    with pytest.raises(ZebraError, match=r"--max-shard-size .*at least one byte"):
        parse_size(size)


def test_output_dir_flushes_the_new_output_before_the_rename_and_the_rename_after(tmp_path, monkeypatch):
    """fsync calls and renames in order, the fsynced descriptors named through /proc (Linux)."""
    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src, dst, **kwargs):
        events.append(("rename", str(src), str(dst)))
        real_rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")  # an older model output, replaced
    with output_dir(out, force=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"x" * 10)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "code.py").write_text("pass")

    (into_place,) = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == str(out)]
    tmp_name = events[into_place][1]
    flushed_before = {e[1] for e in events[:into_place] if e[0] == "fsync"}
    expected = {f"{tmp_name}/model.safetensors", f"{tmp_name}/sub/code.py", f"{tmp_name}/sub", tmp_name}
    assert expected <= flushed_before
    assert ("fsync", str(tmp_path)) in events[into_place + 1 :]  # the folder holding the new name
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "sub"]
