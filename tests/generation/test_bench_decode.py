"""`zebra bench decode` on CPU with a tiny recipe: every field present and sane (no timing thresholds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from zebra.cli.main import app

runner = CliRunner()


def test_bench_decode_tiny_recipe_json():
    result = runner.invoke(
        app,
        ["bench", "decode", "tiny", "--device", "cpu", "--dtype", "fp32", "--batch", "1,2", "--prompt", "16",
         "--new", "4", "--cache", "static", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["model"] == "tiny" and report["dtype"] == "float32" and report["cache"] == "static"
    assert report["cuda_graph"] is False  # no GPU here
    assert report["params"] > 0 and report["weight_bytes_per_step"] > 0 and report["bandwidth_gb_s"] > 0
    assert [r["batch"] for r in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["prefill_tokens_per_s"] > 0 and row["decode_ms_per_token"] > 0
        assert (
            abs(row["decode_tokens_per_s"] - row["batch"] * 1000 / row["decode_ms_per_token"])
            < 1e-6 * row["decode_tokens_per_s"]
        )
        # the raw step (fed on the device) and the generate loop are separate figures; their ratio is reported
        assert row["step_ms_per_token"] > 0
        assert abs(row["loop_over_step"] - row["decode_ms_per_token"] / row["step_ms_per_token"]) < 1e-9
        assert abs(row["roofline_ratio"] - row["step_ms_per_token"] / row["roofline_ms"]) < 1e-9
        assert row["fla_decode_ms_per_token"] is None  # the hybrid has no FLA class: a note instead
        # a static cache for 16 + 4 tokens: the arithmetic's bytes plus the one extra conv column per channel
        assert row["cache_bytes_arch"] <= row["cache_bytes"] < 1.2 * row["cache_bytes_arch"]
        assert row["roofline_ms"] > 0 and row["roofline_ratio"] > 0
        assert row["hf_decode_ms_per_token"] > 0 and row["speedup_vs_hf"] > 0
    assert report["rows"][1]["cache_bytes"] == 2 * report["rows"][0]["cache_bytes"]
    assert "is a hybrid" in report["fla"] and "FLA has classes for pure GDN" in report["fla"]


def test_bench_decode_against_llama_with_a_static_kv_cache(monkeypatch):
    import zebra.bench.train as bench

    small = dict(bench.LLAMA_3_2_1B, vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    monkeypatch.setattr(bench, "LLAMA_3_2_1B", small)
    result = runner.invoke(
        app,
        ["bench", "decode", "tiny", "--device", "cpu", "--dtype", "fp32", "--batch", "1,2", "--prompt", "16",
         "--new", "4", "--no-hf", "--against", "llama", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert "LlamaForCausalLM" in report["llama"] and "static KV cache" in report["llama"]
    for row in report["rows"]:
        # keys and values of 2 layers x 2 KV heads x 16 channels, 16 + 4 positions, float32
        assert row["llama_kv_cache_bytes"] == 2 * 2 * 2 * 16 * 20 * row["batch"] * 4
        assert row["llama_prefill_tokens_per_s"] > 0 and row["llama_decode_ms_per_token"] > 0
        assert row["speedup_vs_llama"] == row["llama_decode_ms_per_token"] / row["decode_ms_per_token"]
    table = runner.invoke(app, ["bench", "decode", "tiny", "--device", "cpu", "--batch", "1", "--prompt", "8",
                                "--new", "2", "--no-hf", "--against", "llama"])  # fmt: skip
    text = " ".join(table.stdout.split())  # the table wraps its headers and notes
    assert table.exit_code == 0 and "Llama: LlamaForCausalLM at Llama-3.2-1B's shape (SDPA)" in text
    bad = runner.invoke(app, ["bench", "decode", "tiny", "--device", "cpu", "--against", "gpt2"])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: --against gpt2: unknown")


def test_bench_decode_table_and_errors():
    result = runner.invoke(
        app,
        [
            "bench",
            "decode",
            "tiny-gdn",
            "--device",
            "cpu",
            "--batch",
            "1",
            "--prompt",
            "8",
            "--new",
            "2",
            "--no-hf",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "decode: tiny-gdn on cpu" in result.stdout
    assert "roofline = (weights" in result.stdout and "HF" not in result.stdout.split("roofline =")[1]
    assert "FLA: skipped (--no-hf)" in result.stdout
    bad = runner.invoke(app, ["bench", "decode", "no-such-recipe", "--device", "cpu"])
    assert bad.exit_code == 1 and "not a model directory, and not a recipe" in bad.stderr
    bad = runner.invoke(app, ["bench", "decode", "tiny", "--batch", "1,x", "--device", "cpu"])
    assert bad.exit_code == 1 and "--batch 1,x" in bad.stderr
    bad = runner.invoke(app, ["bench", "decode", "tiny", "--cache", "paged", "--device", "cpu"])
    assert bad.exit_code == 1 and "--cache paged" in bad.stderr
    bad = runner.invoke(app, ["bench", "decode", "tiny", "--batch", "1,0", "--device", "cpu"])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: --batch 1,0: batch sizes must be at least 1")


def test_bench_decode_lengths_and_profile_json(tmp_path):
    """--lengths: one row per cached length, a large cache against one sized to it; --profile: the step's ops
    (torch ops' self times on a CPU), their calls and time per step."""
    result = runner.invoke(
        app,
        ["bench", "decode", "tiny", "--device", "cpu", "--dtype", "fp32", "--batch", "1", "--prompt", "8",
         "--new", "3", "--no-hf", "--lengths", "5,20", "--capacity", "40", "--profile", "--json",
         "--cache", "static"],  # a static cache: the profile reuses the timed runs' slot
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = report["length_rows"]
    assert [(r["cached"], r["capacity"], r["sized_capacity"]) for r in rows] == [(5, 40, 8), (20, 40, 23)]
    for r in rows:
        assert r["capacity_ms_per_token"] > 0 and r["sized_ms_per_token"] > 0
        assert abs(r["ratio"] - r["capacity_ms_per_token"] / r["sized_ms_per_token"]) < 1e-9
    profile = report["profile"]
    assert profile["batch"] == 1 and profile["source"] == "cpu ops" and profile["mode"] == "eager"
    assert profile["roofline_ms"] == report["rows"][0]["roofline_ms"]
    names = [r["name"] for r in profile["rows"]]
    # the token choice is part of the step; the rows are the 40 slowest ops, so on a busy CPU it may rank below them
    assert "aten::argmax" in names or len(names) == 40
    assert profile["kernels_per_step"] >= sum(r["calls_per_step"] for r in profile["rows"]) > 10
    assert abs(sum(r["share"] for r in profile["rows"]) - 1) < 0.05 or len(names) == 40
    # the mla-decode phase's summary (scripts/gpu-session.sh) reads these reports
    (tmp_path / "decode_mla_tiny.json").write_text(result.stdout)
    script = Path(__file__).resolve().parents[2] / "scripts" / "mla-decode-summary.py"
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--top", "3"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert "## tiny on cpu" in text and "| 5 | " in text and "| 20 | " in text and "profile, batch 1" in text
    assert text.count("| `aten::") == 3


def test_bench_decode_lengths_errors():
    result = runner.invoke(
        app,
        ["bench", "decode", "tiny", "--device", "cpu", "--batch", "1", "--prompt", "8", "--new", "3",
         "--lengths", "5,x"],
    )  # fmt: skip
    assert result.exit_code != 0 and "--lengths 5,x: not a list of integers" in result.output
    result = runner.invoke(
        app,
        ["bench", "decode", "tiny", "--device", "cpu", "--batch", "1", "--prompt", "8", "--new", "3",
         "--lengths", "30", "--capacity", "32"],
    )  # fmt: skip
    assert (
        result.exit_code != 0
        and "--capacity 32: smaller than the longest length + --new (33)" in result.output
    )
