"""Checkpoint files that are torn, corrupt, crafted or old: RNG states stored as plain data and read with
`weights_only=True`, a fallback for corrupt files only, an empty meta.json, RNG files of earlier versions."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from zebra.checkpoint_dir import committed
from zebra.errors import ZebraError
from zebra.recipes import load_recipe
from zebra.train.checkpoint import Checkpointer
from zebra.train.dist import DistEnv
from zebra.train.run import RankLayout, resolve_run
from zebra.train.trainer import Progress

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


class RunsCode:
    """Pickles as a call of os.system: loading it unsafely creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _state(step: int = 0) -> dict:
    return {"progress": Progress(step=step, consumed_samples=8 * step), "w": torch.full((4,), float(step))}


def _saved(tmp_path: Path, steps=(2, 4, 6)) -> Checkpointer:
    ck = Checkpointer(tmp_path, keep_last=5, env=ENV)
    for step in steps:
        ck.save(step, _state(step), {"consumed_samples": 8 * step})
    return ck


def _restore(ck: Checkpointer) -> tuple[int, dict, list[str]]:
    warnings, state = [], _state()
    path, _ = ck.restore(committed(ck.dir), state, warn=warnings.append)
    assert state["progress"].step == int(path.name.split("_")[1])
    return state["progress"].step, state, warnings


def _draws() -> tuple:
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_rng_files_hold_plain_data_and_restore_every_generator(tmp_path):
    ck = _saved(tmp_path, steps=(2,))
    expected = _draws()  # what follows the saved states
    rng_file = ck.dir / "step_0000002" / "rng" / "rank_00000.pt"
    states = torch.load(rng_file, weights_only=True)  # no allow-list needed: tensors, lists, numbers
    assert set(states) == {"torch", "numpy", "python"}
    _draws()
    _restore(ck)
    assert _draws() == expected


def test_rng_files_written_before_plain_data_still_restore(tmp_path):
    ck = _saved(tmp_path, steps=(2,))
    old = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    torch.save(old, ck.dir / "step_0000002" / "rng" / "rank_00000.pt")  # numpy's state as an array
    expected = _draws()
    _restore(ck)
    assert _draws() == expected


def test_an_rng_file_that_would_run_code_is_refused_in_one_line(tmp_path):
    ck = _saved(tmp_path, steps=(2,))
    marker = tmp_path / "ran"
    rng_file = ck.dir / "step_0000002" / "rng" / "rank_00000.pt"
    torch.save({"torch": RunsCode(marker), "numpy": [], "python": []}, rng_file)
    with pytest.raises(ZebraError, match=r"rank_00000.pt: refusing to unpickle posix.system") as err:
        _restore(ck)
    assert "\n" not in str(err.value) and not marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_rng_file_falls_back_to_the_previous_checkpoint(tmp_path, damage):
    ck = _saved(tmp_path)
    rng_file = ck.dir / "step_0000006" / "rng" / "rank_00000.pt"
    if damage == "truncated":
        os.truncate(rng_file, rng_file.stat().st_size // 2)
    else:
        rng_file.write_bytes(b"\x00garbage" * 100)
    step, state, warnings = _restore(ck)
    assert step == 4 and torch.equal(state["w"], torch.full((4,), 4.0))
    (warning,) = warnings
    assert "step_0000006 could not be loaded" in warning and "falling back to step_0000004" in warning
    assert "\n" not in warning


@pytest.mark.parametrize("content", ["", "{", '{"consumed_samples": 48}', "[6]"])
def test_an_empty_or_corrupt_meta_json_falls_back_to_the_previous_checkpoint(tmp_path, content):
    ck = _saved(tmp_path / "run")
    (ck.dir / "step_0000006" / "meta.json").write_text(content)
    recipe = load_recipe("tiny", overrides=["data.mock=true", "data.paths=[]"])
    planned = resolve_run(recipe, RankLayout("cpu", nodes=1, ranks_per_node=1), output=tmp_path, run="run")
    assert planned.checkpoint_step == 4  # what the plan shows
    step, _, warnings = _restore(ck)
    assert step == 4
    (warning,) = warnings
    assert "step_0000006 could not be loaded" in warning and "falling back to step_0000004" in warning


def test_running_out_of_memory_is_raised_not_taken_for_a_torn_checkpoint(tmp_path):
    ck = _saved(tmp_path)

    class NoMemory(Progress):
        def load_state_dict(self, state):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    state = {**_state(), "progress": NoMemory()}
    warnings: list[str] = []
    with pytest.raises(torch.OutOfMemoryError):
        ck.restore(committed(ck.dir), state, warn=warnings.append)
    assert warnings == []


def test_a_torn_dcp_file_still_falls_back(tmp_path):
    ck = _saved(tmp_path)
    shard = ck.dir / "step_0000006" / "__0_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)
    step, _, warnings = _restore(ck)
    assert step == 4 and len(warnings) == 1
