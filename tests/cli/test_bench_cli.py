"""`zebra bench startup` measures fresh processes and reports heavy imports."""

from __future__ import annotations

import json


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
