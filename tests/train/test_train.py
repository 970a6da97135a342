"""Training the real tiny recipes on the bundled corpus: the loss falls for every mixer kind, and a finished run
leaves metrics.jsonl, loss.png, a checkpoint and an HF export that transformers loads."""

from __future__ import annotations

import json
import math

import pytest

from .helpers import losses, sets


@pytest.mark.parametrize("recipe", ["tiny-gdn", "tiny-kda", "tiny-gla", "tiny-mamba", "tiny"])
def test_loss_falls_for_each_mixer_kind(cli, tmp_path, recipe):
    result = cli(
        "train", recipe, "--data", "@sample", "--max-steps", "16", "--output", str(tmp_path), *sets()
    )
    assert result.exit_code == 0, result.output
    curve = losses(tmp_path / recipe)
    assert sorted(curve) == list(range(1, 17))
    first, last = curve[1], sum(curve[s] for s in (14, 15, 16)) / 3
    assert first > 5.0  # an untrained model is near ln(259) = 5.56 nats per byte
    assert last < first - 1.5, curve


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, sample_prefix):
    """A complete tiny run with validation, checkpoints and the export switched on."""
    from typer.testing import CliRunner

    from zebra.cli.main import app

    out = tmp_path_factory.mktemp("runs")
    args = [
        "train",
        "tiny",
        "--data",
        sample_prefix,
        "--max-steps",
        "6",
        "--output",
        str(out),
        "--run",
        "full",
    ]
    args += sets("train.log_interval=2", "train.eval_interval=3", "train.eval_steps=2", "train.save_interval=3",
                 "train.export=true")  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return out / "full", result


def test_metrics_jsonl_has_every_field(finished_run):
    run, _ = finished_run
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in train] == [2, 4, 6]
    assert [r["step"] for r in valid] == [3, 6]
    fields = {
        "step",
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "mfu",
        "memory_gb",
        "tokens",
        "skipped_steps",
    }
    for r in train:
        assert fields <= r.keys()
        assert math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["memory_gb"] > 0
        assert r["mfu"] is None  # no peak FLOP/s is known for a CPU
    assert train[-1]["tokens"] == 6 * 8 * 32
    assert all(math.isfinite(r["val_loss"]) for r in valid)
    (first,) = [r for r in records if "time_to_first_step_s" in r]
    assert first["step"] == 1 and first["time_to_first_step_s"] > 0


def test_the_log_says_when_the_first_step_ended_and_where_kernels_persist(finished_run):
    _, result = finished_run
    assert "first step done" in result.output and "kernel cache" in result.output


def test_run_directory_layout(finished_run):
    run, result = finished_run
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "config.yaml").read_text().startswith("name: tiny")
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_0000006"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_0000003", "step_0000006"]
    assert not list(ckpts.glob("*.partial"))
    assert "HF export" in result.output


def test_checkpoint_keeps_the_model_state_dict_names(finished_run):
    """The converter reads `model.<ZebraForCausalLM name>` straight out of a training checkpoint."""
    import torch.distributed.checkpoint as dcp

    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    run, _ = finished_run
    keys = set(
        dcp.FileSystemReader(str(run / "checkpoints" / "step_0000006")).read_metadata().state_dict_metadata
    )
    model = ZebraForCausalLM(load_recipe(run / "config.yaml").model.to_config())
    assert {f"model.{k}" for k in model.state_dict()} <= keys
    assert {"progress.step", "progress.consumed_samples"} <= keys
    assert any(k.startswith("optimizer.state.model.layers.0.") for k in keys)


def test_export_loads_with_transformers_and_matches_the_checkpoint(finished_run):
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, _ = finished_run
    model = AutoModelForCausalLM.from_pretrained(run / "export", trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(run / "export")
    weight = model.state_dict()["model.layers.2.mixer.A_log"]
    saved = {"model.model.layers.2.mixer.A_log": torch.empty_like(weight)}
    dcp.load(saved, checkpoint_id=str(run / "checkpoints" / "step_0000006"))
    torch.testing.assert_close(weight, saved["model.model.layers.2.mixer.A_log"])
    ids = tokenizer("The zebra", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], model.config.vocab_size)
