"""`zebra bench train` on CPU: the tiny recipes through the trainer's step, and clear errors for FLA comparisons
that cannot run."""

from __future__ import annotations

import importlib.util
import json

import pytest


def test_bench_train_reports_the_trainers_step(cli):
    result = cli("bench", "train", "tiny-gdn", "--steps", "2", "--warmup", "1", "--batch", "2", "--seq-len", "32",
                 "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (row,) = report["rows"]
    assert (report["batch"], report["seq_len"], report["steps"], report["device"]) == (2, 32, 2, "cpu")
    assert row["model"] == "zebra" and row["tokens_per_s"] > 0 and row["mfu"] is None
    assert row["params"] == 126_320 and 4.0 < row["loss"] < 7.0  # random tokens: near ln(272)
    assert report["flops_per_token"] == 6 * row["params"] and report["ratio"] is None
    # the time to first step from the model's build, and from the process start (earlier)
    assert 0 < row["first_step_s"] < row["first_step_process_s"]
    assert (
        row["build_s"] > 0
        and row["step_setup_s"] > 0
        and row["build_s"] + row["step_setup_s"] < row["first_step_s"]
    )
    assert report["kernel_cache"] and report["kernels"] == "torch"
    assert report["notes"] == []


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao")
def test_bench_train_warns_about_float8_layers_left_eager_as_the_trainer_does(cli):
    """FP8 on sublayers that are not compiled is timed as asked, and warned about on stderr with the keys that
    compile them (the trainer's warning); `--json` stays parseable and carries it."""
    result = cli("bench", "train", "tiny-gdn", "--steps", "1", "--warmup", "0", "--batch", "2", "--seq-len", "32",
                 "--json", "--set", "model.hidden_size=256", "--set", "model.intermediate_size=1024",
                 "--set", "train.fp8=true")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (note,) = report["notes"]
    assert "the float8 layers of the '-' sublayers run eager" in note
    assert "--set train.compile=true --set train.compile_sublayers=-" in note
    assert "warning:" in result.stderr and "sublayers run eager" in result.stderr
    assert report["levers"]["fp8"] is True


def test_bench_train_table_states_the_mfu_formula(cli):
    result = cli("bench", "train", "tiny", "--steps", "1", "--warmup", "0", "--batch", "1", "--seq-len", "16")
    assert result.exit_code == 0, result.output
    assert "6N + causal attention" in result.stdout and "tokens/s" in result.stdout
    assert "zebra levers: activation_checkpointing=False, compile=False" in result.stdout
    assert "zebra kernels: torch" in result.stdout
    forced = cli("bench", "train", "tiny", "--steps", "1", "--set", "model.kernel_backend=fla")
    assert (
        forced.exit_code == 1
        and "model.kernel_backend=fla: backend='fla' needs a CUDA/ROCm GPU" in forced.stderr
    )
    assert "s: build " in result.stdout and ", step set-up " in result.stdout


def test_against_fla_needs_a_gpu_and_a_pure_recipe(cli):
    cpu = cli("bench", "train", "tiny-kda", "--against", "fla")
    assert cpu.exit_code == 1 and "FLA's kernels need a GPU" in cpu.stderr
    hybrid = cli("bench", "train", "tiny", "--against", "fla")
    assert hybrid.exit_code == 1 and "FLA has classes for pure GDN / KDA / GLA models only" in hybrid.stderr
    other = cli("bench", "train", "tiny-gdn", "--against", "mamba")
    assert (
        other.exit_code == 1 and "--against mamba: unknown" in other.stderr and "fla, llama" in other.stderr
    )


def test_against_llama_runs_transformers_llama_with_its_own_loss_and_flops(monkeypatch):
    """The Llama row at a small shape on CPU (the 1B shape needs a GPU): transformers' LlamaForCausalLM through
    the same step, levers off, its own FLOPs per token; the zebra row keeps the recipe's levers."""
    from zebra.bench import train as bench

    small = dict(bench.LLAMA_3_2_1B, vocab_size=272, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    monkeypatch.setattr(bench, "LLAMA_3_2_1B", small)
    cfg = bench.TrainBenchConfig(recipe="tiny", steps=1, warmup=1, batch=2, seq_len=32, against="llama",
                                 overrides=["train.fuse_projections=true"])  # fmt: skip
    report = bench.run_train_bench(cfg)
    zebra, llama = report.rows
    assert (
        llama.model == "llama (LlamaForCausalLM)" and report.ratio == zebra.tokens_per_s / llama.tokens_per_s
    )
    assert (
        llama.params == 272 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64
    )  # tied head
    assert llama.flops_per_token == 6 * llama.params + 2 * 3 * 4 * (16 + 16) * 32
    assert zebra.flops_per_token == report.flops_per_token != llama.flops_per_token
    assert 4.0 < llama.loss < 7.0  # random tokens: near ln(272)
    assert report.levers["fuse_projections"] is True and report.measured_peak_flops is None


def test_activation_checkpointing_recomputes_the_comparison_model_too(monkeypatch):
    """At 32k Llama-3.2-1B's shape does not fit one H100 without recomputation (docs/benchmarks.md, long
    context): with the recipe's train.activation_checkpointing the Llama row recomputes its layers as well, and
    says so; the same weights and batches give the same loss."""
    from zebra.bench import train as bench

    small = dict(bench.LLAMA_3_2_1B, vocab_size=272, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    monkeypatch.setattr(bench, "LLAMA_3_2_1B", small)
    built = []
    llama_model = bench.llama_model
    monkeypatch.setattr(bench, "llama_model", lambda *a, **k: built.append(llama_model(*a, **k)) or built[-1])
    rows = {}
    for checkpointing in (False, True):
        cfg = bench.TrainBenchConfig(recipe="tiny", steps=1, warmup=0, batch=2, seq_len=32, against="llama",
                                     overrides=[f"train.activation_checkpointing={str(checkpointing).lower()}"])  # fmt: skip
        rows[checkpointing] = bench.run_train_bench(cfg).rows[1]
    assert [model.is_activation_checkpointing for model in built] == [False, True]
    assert rows[True].model == "llama (LlamaForCausalLM) + activation checkpointing"
    assert rows[True].loss == rows[False].loss


def test_a_comparison_model_out_of_memory_keeps_zebras_row(cli, monkeypatch):
    """Llama's full logits do not fit at 1b-kda-mla's 8 x 8192 on one H200 (2026-12-04): the zebra row, measured
    first, is still reported, with the reason the comparison is missing and what to change. The GPU's
    out-of-memory error is raised by the comparison's build here (a CPU has none to run into)."""
    import torch

    from zebra.bench import train as bench

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 502.00 MiB.")

    monkeypatch.setattr(bench, "llama_model", out_of_memory)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    result = cli("bench", "train", "tiny", "--steps", "1", "--warmup", "0", "--batch", "2", "--seq-len", "32",
                 "--against", "llama", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [row["model"] for row in report["rows"]] == ["zebra"] and report["ratio"] is None
    assert report["against_error"] == (
        "llama ran out of memory at batch 2 x 32; compare at a smaller --batch or --seq-len, or with "
        "--set train.activation_checkpointing=true (both models recompute), or with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (zebra's freed blocks then serve it)"
    )
    table = cli("bench", "train", "tiny", "--steps", "1", "--warmup", "0", "--batch", "2", "--seq-len", "32",
                "--against", "llama")  # fmt: skip
    assert table.exit_code == 0 and "llama ran out of memory at batch 2 x 32" in table.output
