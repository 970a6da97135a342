"""Checkpoint files that are torn, corrupt, crafted or old: RNG states stored as plain data and read with
`weights_only=True`, a fallback for corrupt files only, an empty meta.json, RNG files of earlier versions."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from zebra.core.errors import ZebraError
from zebra.folders.checkpoint_dir import committed, read_meta
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


def test_resuming_with_another_model_is_refused_before_config_yaml_is_rewritten(tmp_path):
    """`zebra train tiny --run R` on a tiny-gdn run R (or a --set of a model width) would write its config.yaml
    over the run's and then fail to load every checkpoint: refused in the plan, naming the keys; a key that keeps
    the model's shapes (the kernel backend) resumes."""
    from zebra.recipes import dump_recipe

    _saved(tmp_path / "run")
    sets = ["data.mock=true", "data.paths=[]"]
    saved = dump_recipe(load_recipe("tiny-gdn", overrides=sets))
    (tmp_path / "run" / "config.yaml").write_text(saved)
    cpu = RankLayout("cpu", nodes=1, ranks_per_node=1)
    for name, more, keys in [("tiny", [], "model.num_layers, model.pattern"),
                             ("tiny-gdn", ["model.hidden_size=48"], "model.hidden_size")]:  # fmt: skip
        with pytest.raises(
            ZebraError, match=f"run: its checkpoints hold another model .*\\({keys} differ"
        ) as e:
            resolve_run(load_recipe(name, overrides=sets + more), cpu, output=tmp_path, run="run")
        assert "--run NAME" in e.value.fix
    assert (tmp_path / "run" / "config.yaml").read_text() == saved
    planned = resolve_run(
        load_recipe("tiny-gdn", overrides=[*sets, "model.kernel_backend=torch"]),
        cpu,
        output=tmp_path,
        run="run",
    )
    assert planned.changed == ["model.kernel_backend"] and planned.checkpoint_step == 6


def test_resuming_with_max_steps_below_the_checkpoint_is_refused(tmp_path):
    """A run at step 6 asked for --max-steps 4 would report 6 steps trained under a header of 4 and write
    max_steps 4 into its config.yaml: refused in the plan; at exactly 6 it only re-exports."""
    _saved(tmp_path / "run")
    cpu = RankLayout("cpu", nodes=1, ranks_per_node=1)
    sets = ["data.mock=true", "data.paths=[]"]
    with pytest.raises(ZebraError, match=r"already at step 6, past train\.max_steps 4") as e:
        resolve_run(
            load_recipe("tiny", overrides=[*sets, "train.max_steps=4"]), cpu, output=tmp_path, run="run"
        )
    assert "--max-steps above 6" in e.value.fix
    planned = resolve_run(
        load_recipe("tiny", overrides=[*sets, "train.max_steps=6"]), cpu, output=tmp_path, run="run"
    )
    assert planned.checkpoint_step == 6


def test_a_run_stopped_after_its_last_log_line_is_summarised_at_its_checkpoint(tmp_path):
    """A signal saves the step in progress, past the last logged loss (every 2 steps here) and validation: the
    summary's step is the checkpoint's, and each figure keeps the step it was logged at."""
    import json

    from zebra.train.summary import summarize_run

    _saved(tmp_path / "run", steps=(2, 5))
    lines = [{"step": 2, "loss": 3.0, "tokens_per_s": 10.0}, {"step": 2, "val_loss": 3.5},
             {"step": 4, "loss": 2.5, "tokens_per_s": 10.0}]  # fmt: skip
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = summarize_run(tmp_path / "run")
    assert (summary["step"], summary["loss"], summary["loss_step"]) == (5, 2.5, 4)
    assert (summary["val_loss"], summary["val_step"]) == (3.5, 2)
    assert summary["checkpoint"].endswith("step_0000005")


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


_TWO_RANKS = """
import sys
from pathlib import Path

import torch

from zebra.folders.checkpoint_dir import committed, read_meta
from zebra.core.errors import ZebraError
from zebra.train.checkpoint import Checkpointer
from zebra.train.dist import barrier, destroy_distributed, init_distributed
from zebra.train.trainer import Progress

env = init_distributed("cpu")
ck = Checkpointer(Path(sys.argv[1]), keep_last=5, env=env)
state = lambda step: {"progress": Progress(step=step, consumed_samples=8 * step), "w": torch.full((4,), 1.0 * step)}
for step in (2, 4):
    ck.save(step, state(step), {})
if env.rank == 1:  # only this rank's RNG file of the newest checkpoint would run code
    (ck.dir / "step_0000004" / "rng" / "rank_00001.pt").write_bytes(Path(sys.argv[2]).read_bytes())
barrier(env)
for source in ("auto", sys.argv[3]):  # this run's checkpoints (rank 0 lists them), then a folder without any
    try:
        ck.resume(source, state(0), warn=lambda w: print("warning:", w))
        print("restored")
    except ZebraError as e:
        print("error:", e.message)
destroy_distributed()
"""


def test_a_refusal_on_one_rank_stops_every_rank_with_one_line_not_a_hang(tmp_path):
    import socket
    import subprocess
    import sys

    crafted, marker, empty = tmp_path / "crafted.pt", tmp_path / "ran", tmp_path / "empty"
    empty.mkdir()
    torch.save({"torch": RunsCode(marker), "numpy": [], "python": []}, crafted)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _TWO_RANKS, str(tmp_path / "run"), str(crafted), str(empty)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=600)[0] for p in ranks]  # before the fix rank 0 waited for rank 1
    finally:
        for p in ranks:
            p.kill()
    assert "rank_00001.pt: refusing to unpickle posix.system" in outputs[1]
    assert "step_0000004: another rank could not read its files" in outputs[0]
    # rank 0 found no checkpoint in --resume PATH: every rank says so, none waits for its list
    assert all(f"error: --resume {empty}: no checkpoint there" in o for o in outputs), outputs
    assert all("Traceback" not in o and "warning:" not in o and "restored" not in o for o in outputs), outputs
    assert not marker.exists()


_OTHER_RUN_SAVES = """
import sys
from pathlib import Path

import torch

from zebra.train.checkpoint import Checkpointer
from zebra.train.dist import DistEnv
from zebra.train.trainer import Progress

step = int(sys.argv[2])
env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
state = {"progress": Progress(step=step, consumed_samples=8 * step), "w": torch.full((4,), float(step))}
Checkpointer(Path(sys.argv[1]), keep_last=1, env=env).save(step, state, {})
"""


def _other_run_saves(run: Path, step: int) -> None:
    """Another process, a live run with keep_last=1, saves `step` (and prunes the rest)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", _OTHER_RUN_SAVES, str(run), str(step)], check=True)


def test_resuming_from_a_live_run_holds_its_checkpoint_against_its_pruning(tmp_path, monkeypatch):
    """`zebra train --resume OTHER_RUN` read the other run's newest checkpoint while that run went on saving
    with keep_last=1: its pruning deleted the folder midway ('no checkpoint could be loaded'). The resume now
    holds it; the other run prunes it at a later save, once released."""
    from zebra.train import checkpoint as ckpt

    other = tmp_path / "other"
    _other_run_saves(other, 2)
    read_meta, saved = ckpt.read_meta, []

    def read_meta_while_the_other_run_saves(path):
        meta = read_meta(path)
        if not saved:  # after meta.json, before the DCP files and the RNG file are read
            _other_run_saves(other, 4)
            saved.append(4)
        return meta

    monkeypatch.setattr(ckpt, "read_meta", read_meta_while_the_other_run_saves)
    ck, state, warnings = Checkpointer(tmp_path / "run", keep_last=5, env=ENV), _state(), []
    path, _ = ck.resume(str(other), state, warn=warnings.append)
    assert path == other / "checkpoints" / "step_0000002" and warnings == []
    assert state["progress"].step == 2 and torch.equal(state["w"], torch.full((4,), 2.0))
    assert [p.name for p in committed(other / "checkpoints")] == ["step_0000004", "step_0000002"]
    _other_run_saves(other, 6)  # released: the next save prunes it
    assert [p.name for p in committed(other / "checkpoints")] == ["step_0000006"]


def test_a_save_of_a_step_being_read_waits_for_its_reader(tmp_path):
    """A run resumed from an older step saves a step that is already there: it used to delete that folder
    while a reader (zebra convert of the run) read it. The save now waits, saying so, and then replaces it."""
    import threading

    from zebra.folders.checkpoint_dir import read_hold

    ck = _saved(tmp_path, steps=(2,))
    step2 = ck.dir / "step_0000002"
    before = {p.relative_to(step2): p.read_bytes() for p in step2.rglob("*") if p.is_file()}
    waiting, errors = threading.Event(), []
    ck.warn = lambda message: (errors.append(message), waiting.set())
    hold = read_hold(step2)
    assert hold is not None

    def save_again():
        ck.save(2, {**_state(2), "w": torch.full((4,), 99.0)}, {"consumed_samples": 99})

    saver = threading.Thread(target=save_again)
    saver.start()
    try:
        assert waiting.wait(120), "the save did not wait for the reader"
        assert saver.is_alive()
        now = {p.relative_to(step2): p.read_bytes() for p in step2.rglob("*") if p.is_file()}
        assert now == before  # the reader still sees the folder it holds, whole
    finally:
        os.close(hold)
        saver.join(120)
    (message,) = errors
    assert f"{step2} is being read" in message and "waiting for it to finish" in message
    assert read_meta(step2)["consumed_samples"] == 99
    _, state, _ = _restore(ck)
    assert torch.equal(state["w"], torch.full((4,), 99.0))
    assert sorted(p.name for p in ck.dir.iterdir()) == ["latest", "step_0000002"]  # nothing left aside


def test_starting_over_is_refused_while_a_checkpoint_is_read(tmp_path):
    """`zebra train --resume never --yes` on a run deleted its checkpoints under a reader: it now refuses in one
    line, deleting nothing, and starts over once the reader is done."""
    from zebra.folders.checkpoint_dir import read_hold
    from zebra.train.run import prepare_run

    ck = _saved(tmp_path / "run", steps=(2, 4))
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    recipe = load_recipe("tiny", overrides=["data.mock=true", "data.paths=[]"])
    cpu = RankLayout("cpu", nodes=1, ranks_per_node=1)
    planned = resolve_run(recipe, cpu, output=tmp_path, run="run", resume="never")
    hold = read_hold(ck.dir / "step_0000002")
    try:
        with pytest.raises(ZebraError, match=r"step_0000002: being read \(zebra convert") as e:
            prepare_run(planned, start_over=True)
        assert "start the run over again" in e.value.fix
        assert [p.name for p in committed(ck.dir)] == ["step_0000004", "step_0000002"]
        assert (tmp_path / "run" / "metrics.jsonl").is_file()
    finally:
        os.close(hold)
    prepare_run(planned, start_over=True)
    assert not ck.dir.exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_lost_node_error_names_the_step_a_resume_reads_when_the_newest_meta_is_torn(tmp_path):
    from zebra.train.peers import Peer, lost_nodes_error

    for step, meta in ((10, '{"step": 10}'), (20, '{"st')):  # step 20's meta.json torn by the crash
        folder = tmp_path / "checkpoints" / f"step_{step:07d}"
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"")
        (folder / "meta.json").write_text(meta)
    lost = [Peer(rank=1, node=1, host="node-b", address="10.0.0.2", port=29600)]
    error = lost_nodes_error(lost, ConnectionError("Connection closed by peer"), tmp_path)
    assert "node 1 (node-b" in error.message and "continues from step 10" in error.fix
    assert "the start" in lost_nodes_error(lost, ConnectionError("x"), tmp_path / "none").fix


@pytest.mark.parametrize("torn_new_meta", [False, True])
def test_a_save_killed_between_its_two_renames_loses_neither_copy(tmp_path, monkeypatch, torn_new_meta):
    """A save of a step already there sets the old folder aside, then renames the new one into place: killed in
    between, the step had no folder under its name, the resume fell back to an older step and the next save's
    prune deleted both copies. The resume now puts back the new copy (the old one where the new is torn)."""
    ck = _saved(tmp_path, steps=(2, 4))
    real_rename = Path.rename

    def killed_after_setting_aside(self, target):
        if self.name == "step_0000004.partial":
            raise KeyboardInterrupt  # the process dies here
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", killed_after_setting_aside)
    with pytest.raises(KeyboardInterrupt):
        ck.save(4, {**_state(4), "w": torch.full((4,), 99.0)}, {"consumed_samples": 99})
    monkeypatch.undo()
    assert not (ck.dir / "step_0000004").exists()
    if torn_new_meta:
        (ck.dir / "step_0000004.partial" / "meta.json").write_text("")
    warnings, state = [], _state()
    path, meta = ck.resume("auto", state, warn=warnings.append)
    assert path == ck.dir / "step_0000004" and warnings == []
    assert meta["consumed_samples"] == (32 if torn_new_meta else 99)
    assert torch.equal(state["w"], torch.full((4,), 4.0 if torn_new_meta else 99.0))
    ck.save(6, _state(6), {"consumed_samples": 48})  # the prune keeps the recovered step
    assert [p.name for p in committed(ck.dir)] == ["step_0000006", "step_0000004", "step_0000002"]
