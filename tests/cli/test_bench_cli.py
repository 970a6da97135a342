"""`zebra bench startup` measures fresh processes and reports heavy imports."""

from __future__ import annotations

import json

import pytest


def test_bench_startup_json(cli):
    result = cli("bench", "startup", "--repeats", "1", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["command"] for r in rows] == [
        "python -c pass",
        "zebra --help",
        "zebra --version",
        "zebra recipes list",
    ]
    assert rows[0]["heavy_imports"] is None
    for row in rows[1:]:
        assert row["heavy_imports"] == []
        assert row["runs"] == 1 and 0 < row["min_s"] <= row["median_s"]


def test_bench_startup_table(cli):
    result = cli("bench", "startup", "-n", "1")
    assert result.exit_code == 0
    assert "zebra --help" in result.stdout and "heavy imports" in result.stdout and " ms " in result.stdout


def test_bench_rejects_zero_repeats(cli):
    result = cli("bench", "startup", "--repeats", "0")
    assert result.exit_code == 2


def test_bench_ssd_errors_on_cpu(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU error")
    no_gpu = cli("bench", "ssd")
    assert no_gpu.exit_code == 1 and "no CUDA/ROCm GPU here" in no_gpu.stderr
    no_mamba = cli("bench", "ssd", "tiny-gdn")
    assert no_mamba.exit_code == 1 and "has no Mamba2 sublayer" in no_mamba.stderr
