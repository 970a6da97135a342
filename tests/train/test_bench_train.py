"""`zebra bench train` on CPU: the tiny recipes through the trainer's step, and clear errors for FLA comparisons
that cannot run."""

from __future__ import annotations

import json


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
    assert report["kernel_cache"]


def test_bench_train_table_states_the_mfu_formula(cli):
    result = cli("bench", "train", "tiny", "--steps", "1", "--warmup", "0", "--batch", "1", "--seq-len", "16")
    assert result.exit_code == 0, result.output
    assert "6N + causal MLA attention" in result.stdout and "tokens/s" in result.stdout


def test_against_fla_needs_a_gpu_and_a_pure_recipe(cli):
    cpu = cli("bench", "train", "tiny-kda", "--against", "fla")
    assert cpu.exit_code == 1 and "FLA's kernels need a GPU" in cpu.stderr
    hybrid = cli("bench", "train", "tiny", "--against", "fla")
    assert hybrid.exit_code == 1 and "FLA has classes for pure GDN and pure KDA models only" in hybrid.stderr
    other = cli("bench", "train", "tiny-gdn", "--against", "mamba")
    assert other.exit_code == 1 and "--against mamba: unknown" in other.stderr
