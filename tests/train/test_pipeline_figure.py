"""scripts/pipeline-figure.py end to end on the CPU at toy size: a tiny 6-layer Llama teacher, byte-tokenized text."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from tests.upcycle.teachers import tiny_llama

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pipeline-figure.py"


def test_the_pipeline_script_reports_three_pipelines_at_equal_tokens(tmp_path, sample_prefix):
    teacher = tiny_llama(tmp_path / "teacher", num_hidden_layers=6, seed=1)
    out = tmp_path / "figure"
    args = [str(teacher), "--train", sample_prefix, "--heldout", sample_prefix, "--output", str(out), "--mixer",
            "gdn", "--mla", "3", "--steps", "6", "--batch", "2", "--seq", "32", "--heldout-windows", "2",
            "--calibration", "2", "--device", "cpu"]  # fmt: skip
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
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
