"""Engine pieces: AdamW parameter groups and the schedule, MFU, the rank environment launchers rely on, and the
non-finite loss guard."""

from __future__ import annotations

import json
import math

import pytest

from zebra.launch import commands
from zebra.recipes import load_recipe
from zebra.train.dist import first_slurm_host, slurm_to_torch_env
from zebra.train.metrics import mfu, peak_flops
from zebra.train.optim import lr_at, param_groups

from .helpers import sets


def test_no_weight_decay_on_norms_biases_and_recurrent_gains():
    from zebra.models import ZebraForCausalLM

    model = ZebraForCausalLM(load_recipe("tiny").model.to_config())
    decay, no_decay = param_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    kept = {names[id(p)] for p in no_decay["params"]}
    decayed = {names[id(p)] for p in decay["params"]}
    for leaf in ("A_log", "dt_bias", "D", "norm.weight", "o_norm.weight", "g_proj.1.bias", "conv1d.bias"):
        assert any(n.endswith(leaf) for n in kept), leaf
        assert not any(n.endswith("." + leaf) for n in decayed), leaf
    assert "model.embeddings.weight" in decayed and "model.layers.1.mixer.gate_proj.weight" in decayed
    assert all(p.ndim >= 2 for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))  # tied head once


def test_schedule_warms_up_then_decays_to_min_lr():
    t = load_recipe("tiny", overrides=["train.max_steps=110", "train.warmup_steps=10", "train.lr=1e-3",
                                       "train.min_lr=1e-4"]).train  # fmt: skip
    assert lr_at(0, t) == pytest.approx(1e-4) and lr_at(9, t) == pytest.approx(1e-3)
    assert lr_at(60, t) == pytest.approx(5.5e-4)  # cosine midpoint: (lr + min_lr) / 2
    assert lr_at(110, t) == pytest.approx(1e-4) and lr_at(500, t) == pytest.approx(1e-4)
    assert all(lr_at(s, t) >= lr_at(s + 1, t) for s in range(10, 120))
    t.lr_decay_style = "linear"
    assert lr_at(35, t) == pytest.approx(1e-3 - 0.25 * 9e-4)
    t.lr_decay_style = "constant"
    assert lr_at(100, t) == 1e-3


def test_peak_table_and_mfu_formula():
    assert peak_flops("NVIDIA H200") == peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("AMD Instinct MI300X") == 1307e12 and peak_flops("AMD Instinct MI250X") == 383e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12 and peak_flops("Some CPU") is None
    assert mfu(6e9, 50_000, 1, 989e12) == pytest.approx(6e9 * 5e4 / 989e12)
    assert mfu(6e9, 400_000, 8, 989e12) == pytest.approx(mfu(6e9, 50_000, 1, 989e12))
    assert mfu(6e9, 50_000, 1, None) is None


def test_slurm_tasks_become_torch_ranks():
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5", "SLURM_JOB_NODELIST": "gpu[03-04]",
             "SLURM_JOB_ID": "4242"}  # fmt: skip
    env = slurm_to_torch_env(slurm)
    assert env == {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "MASTER_ADDR": "gpu03",
                   "MASTER_PORT": str(20000 + 4242)}  # fmt: skip
    assert slurm_to_torch_env({"RANK": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}) == {}  # torchrun wins
    assert first_slurm_host("node7,node[10-12]") == "node7"


def test_rank_and_torchrun_commands_for_launchers(tmp_path):
    cmd = commands.rank_command(tmp_path / "run", python="python3")
    assert cmd == [
        "python3",
        "-m",
        "zebra.cli.rank",
        str(tmp_path / "run"),
        "--resume",
        "auto",
        "--device",
        "auto",
    ]
    one = commands.torchrun_command("r", nproc_per_node=8, python="python3")
    assert one[:6] == [
        "python3",
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=8",
        "--nnodes=1",
        "--standalone",
    ]
    two = commands.torchrun_command(
        "r", nproc_per_node=8, nnodes=2, rdzv_endpoint="n1:29500", python="python3"
    )
    assert "--rdzv-endpoint=n1:29500" in two and f"--rdzv-id={commands.run_id('r')}" in two
    env = commands.rank_env(
        rank=9, local_rank=1, world_size=16, local_world_size=8, master_addr="n1", master_port=29500
    )
    assert env["RANK"] == "9" and env["LOCAL_RANK"] == "1" and env["MASTER_PORT"] == "29500"


def test_entry_point_reports_a_missing_run_as_one_line(tmp_path, capsys):
    from zebra.cli.rank import main

    assert main([str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert "config.yaml: not found" in err and "Traceback" not in err


def _nan_on_call(calls: set[int]):
    """build_model whose real ZebraForCausalLM returns a NaN loss on the given forward calls (training forwards
    compute the loss inside and return no logits; a fault injection: a real divergence is too slow to provoke on
    a tiny model)."""
    from zebra.train import trainer

    real = trainer.build_model
    count = {"n": 0}

    def build(recipe, device):
        model = real(recipe, device)

        def poison(_module, _args, output):
            count["n"] += 1
            if count["n"] in calls:
                output.loss = output.loss * float("nan")
            return output

        model.register_forward_hook(poison)
        return model

    return build


def test_non_finite_loss_skips_the_step_and_counts_it(cli, tmp_path, sample_prefix, monkeypatch):
    from zebra.train import trainer

    monkeypatch.setattr(trainer, "build_model", _nan_on_call({3}))
    result = cli("train", "tiny-mamba", "--data", sample_prefix, "--max-steps", "5", "--output", str(tmp_path),
                 *sets())  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "non-finite loss or gradient at step 3" in " ".join(result.output.split())
    lines = (tmp_path / "tiny-mamba" / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "loss" in r]  # training records, not time to first step
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 1, 1]
    assert records[2]["loss"] == "nan" and all(math.isfinite(r["loss"]) for r in records[3:])


def test_a_step_read_one_step_late_is_still_counted_and_logged(cli, tmp_path, sample_prefix, monkeypatch):
    """Steps that do not log are read once the next step is queued: the skip at step 3 (not a logging step with
    log_interval 2) still shows at step 4, whose interval's mean loss leaves the skipped step out."""
    from zebra.train import trainer

    monkeypatch.setattr(trainer, "build_model", _nan_on_call({3}))
    result = cli("train", "tiny-mamba", "--data", sample_prefix, "--max-steps", "5", "--output", str(tmp_path),
                 *sets("train.log_interval=2"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "non-finite loss or gradient at step 3" in " ".join(result.output.split())
    lines = (tmp_path / "tiny-mamba" / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "loss" in r]
    assert [(r["step"], r["skipped_steps"]) for r in records] == [(2, 0), (4, 1), (5, 1)]
    assert all(math.isfinite(r["loss"]) for r in records)


def test_the_trainer_reads_a_step_after_queueing_the_next(cli, tmp_path, sample_prefix, monkeypatch):
    """What keeps a GPU's queue from running dry between steps: the loop reads a step's figures only once the next
    step is queued, except the first step and those that log (here 4) or end the run (6). Torch's fused AdamW, as
    on a GPU (its CPU form here), lets the step itself run without reading them."""
    import torch

    from zebra.train import trainer
    from zebra.train.optim import param_groups
    from zebra.train.step import StepResult, TrainStep

    def fused_adamw(model, spec, device, mixers=None):
        return torch.optim.AdamW(param_groups(model, spec.weight_decay, mixers), lr=spec.lr, fused=True)

    events, results = [], []
    real_call, real_read = TrainStep.__call__, StepResult._read

    def call(self, *args, **kwargs):
        result = real_call(self, *args, **kwargs)
        results.append(result)
        events.append(("queued", len(results)))
        return result

    def read(self):
        if self._values is None:
            events.append(("read", results.index(self) + 1))
        return real_read(self)

    monkeypatch.setattr(trainer, "build_optimizer", fused_adamw)
    monkeypatch.setattr(TrainStep, "__call__", call)
    monkeypatch.setattr(StepResult, "_read", read)
    result = cli("train", "tiny-mamba", "--data", sample_prefix, "--max-steps", "6", "--output", str(tmp_path),
                 *sets("train.log_interval=4"))  # fmt: skip
    assert result.exit_code == 0, result.output
    order = [("queued", 1), ("read", 1), ("queued", 2), ("queued", 3), ("read", 2), ("queued", 4), ("read", 3),
             ("read", 4), ("queued", 5), ("queued", 6), ("read", 5), ("read", 6)]  # fmt: skip
    assert events == order


def test_non_finite_loss_stops_with_exit_code_3_when_asked(cli, tmp_path, sample_prefix, monkeypatch):
    from zebra.train import trainer

    monkeypatch.setattr(trainer, "build_model", _nan_on_call({2}))
    result = cli("train", "tiny-mamba", "--data", sample_prefix, "--max-steps", "5", "--output", str(tmp_path),
                 *sets("train.nonfinite=stop"))  # fmt: skip
    assert result.exit_code == 3
    assert "error: non-finite loss or gradient at step 2" in " ".join(result.stderr.split())
    assert "Traceback" not in result.output


def test_activation_checkpointing_changes_memory_not_results(cli, tmp_path, sample_prefix):
    import torch.distributed.checkpoint as dcp

    from .helpers import losses

    for run, ac in (("plain", "false"), ("ac", "true")):
        result = cli("train", "tiny", "--data", sample_prefix, "--max-steps", "3", "--output", str(tmp_path),
                     "--run", run, *sets(f"train.activation_checkpointing={ac}"))  # fmt: skip
        assert result.exit_code == 0, result.output
    assert losses(tmp_path / "ac") == losses(tmp_path / "plain")
    ckpt = tmp_path / "ac" / "checkpoints" / "step_0000003"
    keys = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    assert "model.model.layers.0.mixer.q_down_proj.weight" in keys
    assert not any("_checkpoint_wrapped_module" in k for k in keys)
