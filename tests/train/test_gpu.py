"""On a GPU: the 1.2B pure-GDN recipe trains (bf16, one GPU), and its tokens/s is printed next to
`zebra bench train` at the same micro batch and next to FLA's own model (run with `pytest -m gpu -s`); an upcycled
student distils from its teacher on one GPU; the graphed forward/backward trains like the eager step."""

from __future__ import annotations

import json
import math

import pytest
from tests.upcycle.teachers import tiny_llama

from .helpers import distil, records, upcycled_student

pytestmark = pytest.mark.gpu


def test_1b_gdn_pure_trains_on_one_gpu(cli, tmp_path):
    from zebra.train.summary import summarize_run

    result = cli("train", "1b-gdn-pure", "--max-steps", "20", "--mock-data", "--gpus", "1", "--output", str(tmp_path),
                 "--set", "train.global_batch_size=64", "--set", "train.log_interval=10")  # fmt: skip
    assert result.exit_code == 0, result.output
    run = tmp_path / "1b-gdn-pure"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [10, 20]
    assert all(math.isfinite(r["loss"]) for r in train) and train[1]["loss"] < train[0]["loss"]
    assert train[1]["mfu"] is not None and train[1]["memory_gb"] > 1
    assert (run / "checkpoints" / "step_0000020" / "meta.json").is_file()
    assert (run / "export" / "config.json").is_file()
    s = summarize_run(run)
    print(f"\nzebra train 1b-gdn-pure (global 64 = 8 x 8 accumulation, seq 2048): {s['tokens_per_s']:,.0f} tok/s, "
          f"MFU {100 * train[1]['mfu']:.1f}%, peak {train[1]['memory_gb']:.1f} GB")  # fmt: skip


def test_bench_train_1b_gdn_pure_against_fla(cli):
    result = cli(
        "bench", "train", "1b-gdn-pure", "--batch", "8", "--steps", "10", "--against", "fla", "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    zebra, fla = report["rows"]
    assert zebra["params"] == fla["params"] == 1_203_441_152
    assert math.isfinite(zebra["loss"]) and math.isfinite(fla["loss"])
    print(f"\nzebra bench train 1b-gdn-pure batch 8 x 2048: zebra {zebra['tokens_per_s']:,.0f} tok/s "
          f"({zebra['peak_memory_gb']:.1f} GB), FLA {fla['tokens_per_s']:,.0f} tok/s ({fla['peak_memory_gb']:.1f} GB), "
          f"ratio {report['ratio']:.2f}")  # fmt: skip


def test_distillation_runs_on_one_gpu(cli, tmp_path, sample_prefix):
    """`zebra train --init DIR --teacher T --gpus 1` in bf16: the teacher (bf16 on the GPU) and the student share the
    device, every step logs the KL and both CEs, and the KL falls."""
    teacher = tiny_llama(tmp_path / "llama", seed=3)
    student = upcycled_student(tmp_path / "gdn", teacher, mla=1)
    result = distil(cli, sample_prefix, tmp_path, "gpu", teacher, student, "--gpus", "1",
                    "--set", "train.precision=bf16", steps=8)  # fmt: skip
    assert "1 rank(s) on 1 x cuda" in result.output  # the describe() line: "{world} x {device}" on a GPU
    train = [r for r in records(tmp_path / "gpu") if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 9))
    assert all(math.isfinite(r["kl"]) and r["ce"] > 0 and r["teacher_ce"] > 0 for r in train)
    assert train[-1]["kl"] < 0.7 * train[0]["kl"]
