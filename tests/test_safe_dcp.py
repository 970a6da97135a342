"""Distributed checkpoints read without running code from them: `.metadata` through an allow-listed unpickler,
non-tensor values through `torch.load(weights_only=True)`, for `zebra train --resume` and `zebra convert`; the
allow-list reads real checkpoints (zebra's and megatron-core's torch_dist)."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zebra.cli.main import app

FAST = ["--mock-data", "--max-steps", "2", "--set", "data.seq_len=32", "--set", "train.global_batch_size=8",
        "--set", "train.eval_interval=0", "--set", "train.export=false"]  # fmt: skip


class RunsCode:
    """Pickles as a call of os.system: loading it unsafely creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def _one_line_refusal(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, result.stderr
    text = " ".join(result.stderr.split())
    for needle in needles:
        assert needle in text, text


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished 2-step run of `tiny` on mock data (one checkpoint, step 2)."""
    out = tmp_path_factory.mktemp("runs")
    result = _cli("train", "tiny", *FAST, "--output", str(out), "--run", "base")
    assert result.exit_code == 0, result.output
    return out / "base"


def _copy_checkpoint(run_dir: Path, dest: Path) -> Path:
    """A copy of the run (config.yaml + its checkpoint), to tamper with."""
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("metrics.jsonl", "data_cache", "*.png"))
    return dest / "checkpoints" / "step_0000002"


def test_crafted_metadata_is_refused_by_train_resume_and_convert(run_dir, tmp_path):
    step = _copy_checkpoint(run_dir, tmp_path / "crafted")
    marker = tmp_path / "ran"
    (step / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))

    resumed = _cli("train", "tiny", *FAST, "--output", str(tmp_path), "--run", "new", "--resume", str(step))
    _one_line_refusal(resumed, f"{step}/.metadata", "refusing to unpickle posix.system")
    converted = _cli("convert", str(step), "-o", str(tmp_path / "export"))
    _one_line_refusal(converted, f"{step}/.metadata", "refusing to unpickle posix.system")
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_crafted_non_tensor_value_is_refused_by_train_resume(run_dir, tmp_path):
    """DCP stores non-tensor values (step counters, schedule state) as pickles inside the .distcp files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    step = _copy_checkpoint(run_dir, tmp_path / "crafted")
    dcp_to_torch_save(step, tmp_path / "full.pt")
    state = torch.load(tmp_path / "full.pt", weights_only=False)  # our own file
    marker = tmp_path / "ran"
    state["progress"]["skipped_steps"] = RunsCode(marker)
    for name in (".metadata", "__0_0.distcp"):
        (step / name).unlink()
    dcp.save(state, checkpoint_id=str(step), no_dist=True)

    resumed = _cli("train", "tiny", *FAST, "--output", str(tmp_path), "--run", "new", "--resume", str(step))
    _one_line_refusal(resumed, "progress.skipped_steps", "refusing to unpickle posix.system")
    assert not marker.exists()


def test_the_allow_list_reads_zebra_and_megatron_checkpoints(run_dir, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent / "convert"))
    try:
        from convert_helpers import build_model
        from megatron_writer import write_torch_dist
    finally:
        sys.path.pop(0)
    from zebra.core.safe_dcp import load_metadata
    from zebra.spec import arch

    _, model = build_model("mamba-mla")
    megatron = write_torch_dist(tmp_path / "mg", model, arch.resolve_pattern(model.config), te=True)
    (megatron_metadata,) = megatron.rglob(".metadata")
    for metadata_file in (run_dir / "checkpoints" / "step_0000002" / ".metadata", megatron_metadata):
        with open(metadata_file, "rb") as f:
            expected = pickle.load(f)  # files written here, by torch and megatron-core
        got = load_metadata(metadata_file)
        assert got.state_dict_metadata == expected.state_dict_metadata
        assert got.storage_data == expected.storage_data
