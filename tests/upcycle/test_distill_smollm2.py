"""The real teacher end to end: SmolLM2-135M-Instruct (its GGUF) upcycled into a GDN hybrid with two MLA layers,
then distilled by `zebra train --init --teacher` on Python documentation for a few steps."""

from __future__ import annotations

import json

import pytest
from tests.train.helpers import sets
from typer.testing import CliRunner

from zebra.cli.main import app
from zebra.upcycle import StudentOptions, upcycle_teacher


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the 30-layer teacher and student on the shared CPU: about a minute per step
def test_a_few_distillation_steps_lower_the_kl_to_smollm2(
    tmp_path, smollm2_gguf, smollm2_teacher, smollm2_4layer_dir, python_docs_tokens
):
    student = tmp_path / "student"
    upcycle_teacher(smollm2_teacher, student, StudentOptions(mixer="gdn", mla=2))
    result = CliRunner().invoke(app, [
        "train", "tiny", "--init", str(student), "--teacher", str(smollm2_gguf),
        "--data", str(python_docs_tokens), "--output", str(tmp_path / "runs"), "--run", "kd", "--max-steps", "4",
        *sets("data.seq_len=64", "train.global_batch_size=2", "train.micro_batch_size=2", "train.lr=2e-3",
              "train.warmup_steps=1", f"data.tokenizer={smollm2_4layer_dir}",
              "data.split=90,10,0"),  # 48 pages: a 1% validation split would have none (megatron loops forever)
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "runs" / "kd" / "metrics.jsonl").read_text().splitlines()
    kl = [r["kl"] for r in map(json.loads, lines) if "kl" in r]
    assert len(kl) == 4
    assert kl[-1] < 0.9 * kl[0], kl
