"""scripts/upcycle-figure.py end to end on the CPU at toy size: a tiny Llama teacher, byte-tokenized text, 2 steps."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from tests.upcycle.teachers import tiny_llama

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "upcycle-figure.py"


def test_the_figure_script_runs_and_reports_every_model(tmp_path, sample_prefix):
    teacher = tiny_llama(tmp_path / "teacher", seed=1)
    out = tmp_path / "figure"
    args = [str(teacher), "--train", sample_prefix, "--heldout", sample_prefix, "--output", str(out),
            "--mla", "1", "--steps", "2", "--batch", "2", "--seq", "32", "--heldout-windows", "2",
            "--decode-tokens", "3", "--device", "cpu", "--svd", "activation", "--svd-samples", "2"]  # fmt: skip
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "figure.json").read_text())
    assert [s["mixer"] for s in result["students"]] == ["mamba", "gdn"]
    assert all(s["svd"]["method"] == "activation" and s["svd"]["tokens"] == 1024 for s in result["students"])
    assert math.isfinite(result["teacher"]["heldout_ce"]) and result["teacher"]["decode_ms_per_token"] > 0
    for s in result["students"]:
        for curve in (s["kd"], s["scratch"]):
            assert [p["step"] for p in curve] == [0, 1, 2]
            assert [p["tokens"] for p in curve] == [0, 64, 128]
            assert all(math.isfinite(p["heldout_ce"]) for p in curve)
        assert s["upcycled_step0_ce"] == s["kd"][0]["heldout_ce"]
        assert 0 < s["kv_cache_percent"] < 100 and s["decode_ms_per_token"] > 0
    assert (out / "figure.png").stat().st_size > 0
    assert "KD/teacher" in done.stdout  # the table


def test_a_run_cut_short_keeps_the_students_it_finished(tmp_path, sample_prefix):
    teacher = tiny_llama(tmp_path / "teacher", seed=1)
    out = tmp_path / "figure"
    args = [str(teacher), "--train", sample_prefix, "--heldout", sample_prefix, "--output", str(out),
            "--mixers", "mamba,no-such-mixer", "--mla", "1", "--steps", "1", "--batch", "2", "--seq", "32",
            "--heldout-windows", "2", "--decode-tokens", "2", "--device", "cpu"]  # fmt: skip
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
    assert done.returncode != 0 and "no-such-mixer" in done.stderr
    result = json.loads((out / "figure.json").read_text())
    assert [s["mixer"] for s in result["students"]] == ["mamba"]
    assert (out / "figure.png").stat().st_size > 0
