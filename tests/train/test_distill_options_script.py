"""scripts/distill-options.py end to end on the CPU at toy size: a tiny 4-layer Llama teacher, byte-tokenized text."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from tests.upcycle.teachers import tiny_llama

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "distill-options.py"


def test_every_variant_reports_a_held_out_ce_at_equal_tokens(tmp_path, sample_prefix):
    teacher = tiny_llama(tmp_path / "teacher", num_hidden_layers=4, seed=1)
    out = tmp_path / "options"
    args = [str(teacher), "--train", sample_prefix, "--heldout", sample_prefix, "--output", str(out), "--mixer",
            "gdn", "--mla", "2", "--steps", "5", "--batch", "2", "--seq", "32", "--heldout-windows", "2",
            "--top-k", "8", "--device", "cpu"]  # fmt: skip
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "options.json").read_text())
    variants = {v["variant"]: v for v in result["variants"]}
    assert list(variants) == ["kd", "kd+ce", "topk", "groups", "groups+warm", "ild+kd", "ildmix+kd"]
    assert {v["tokens"] for v in variants.values()} == {5 * 2 * 32}
    assert variants["ild+kd"]["ild_steps"] == 1 and variants["ild+kd"]["kd_steps"] == 4
    assert all(math.isfinite(v["heldout_ce"]) for v in variants.values())
    assert len({round(v["heldout_ce"], 6) for v in variants.values()}) > 1  # the options change the outcome
    assert math.isfinite(result["teacher_ce"]) and "ildmix+kd" in done.stdout
    # --init: every variant starts from a given export (here the first run's student) instead of a fresh upcycle
    init = [str(tmp_path / "from-init"), "--init", str(out / "student"), "--variants", "kd"]
    again = [*args[:6], *init, *args[9:]]  # the first run's --output and --mixer replaced
    done = subprocess.run([sys.executable, str(SCRIPT), *again], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    from_init = json.loads((tmp_path / "from-init" / "options.json").read_text())
    assert from_init["start_ce"] == result["start_ce"] and not (tmp_path / "from-init" / "student").exists()
    # the same start and the same steps: the same held-out CE
    assert from_init["variants"][0]["heldout_ce"] == variants["kd"]["heldout_ce"]


def test_an_unknown_variant_is_refused_in_one_line(tmp_path, sample_prefix):
    done = subprocess.run([sys.executable, str(SCRIPT), "teacher", "--train", sample_prefix, "--heldout",
                           sample_prefix, "--output", str(tmp_path / "o"), "--variants", "kd,kl2"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2 and "--variants: unknown kl2" in done.stderr
    assert not (tmp_path / "o").exists()
