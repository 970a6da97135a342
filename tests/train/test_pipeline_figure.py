"""scripts/pipeline-figure.py end to end on the CPU at toy size: a tiny 6-layer Llama teacher, byte-tokenized text."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from tests.upcycle.teachers import tiny_llama

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pipeline-figure.py"


def run_script(tmp_path, sample_prefix, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The script at toy size (a 6-layer teacher, 6 steps of 2 x 32 tokens, 3 MLA layers) into tmp_path/figure."""
    teacher = tiny_llama(tmp_path / "teacher", num_hidden_layers=6, seed=1)
    out = tmp_path / "figure"
    args = [str(teacher), "--train", sample_prefix, "--heldout", sample_prefix, "--output", str(out), "--mixer",
            "gdn", "--mla", "3", "--steps", "6", "--batch", "2", "--seq", "32", "--heldout-windows", "2",
            "--calibration", "2", "--device", "cpu", *extra]  # fmt: skip
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900
    ), out


def test_the_pipeline_script_reports_three_pipelines_at_equal_tokens(tmp_path, sample_prefix):
    done, out = run_script(tmp_path, sample_prefix)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "pipeline.json").read_text())
    names = [p["pipeline"] for p in result["pipelines"]]
    assert names == ["upcycle+KD", "upcycle+ILD+KD", "upcycle+ILD+SMART+KD"]
    assert {p["tokens"] for p in result["pipelines"]} == {6 * 2 * 32}  # equal total tokens
    for p in result["pipelines"]:
        assert all(math.isfinite(q["heldout_ce"]) for q in p["curve"])
        assert 0 < p["kv_cache_percent"] < 100 and len(p["mla_layers"]) == 3
    smart = result["smart"]
    assert len(smart["scores"]) == 6 and result["pipelines"][2]["mla_layers"] == smart["selected"]
    assert result["pipelines"][2]["placement"] == "smart" and result["pipelines"][1]["placement"] == "even"
    assert (out / "pipeline.png").stat().st_size > 0 and "SMART scores" in done.stdout


def test_pipelines_picks_which_run_so_a_short_call_can_split_the_figure(tmp_path, sample_prefix):
    done, out = run_script(tmp_path, sample_prefix, "--pipelines", "smart")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "pipeline.json").read_text())
    [smart_run] = result["pipelines"]
    assert smart_run["pipeline"] == "upcycle+ILD+SMART+KD" and smart_run["tokens"] == 6 * 2 * 32
    assert smart_run["mla_layers"] == result["smart"]["selected"]
    assert not (out / "upcycled-hybrid").exists()  # the upcycle+KD pipeline did not run
    assert (out / "pipeline.png").stat().st_size > 0


def test_an_unknown_pipeline_is_refused_in_one_line(tmp_path, sample_prefix):
    done, out = run_script(tmp_path, sample_prefix, "--pipelines", "kd,ild2")
    assert done.returncode == 2 and "--pipelines: unknown ild2; choose from kd, ild, smart" in done.stderr
    assert not out.exists()
