"""Kill a real `zebra data prep` process with SIGKILL mid-run, run the same command again: nothing lost or doubled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app
from zebra.data.manifest import read_manifest

from .helpers import expected_ids, read_all, write_source

SHARDS = 16


def _prep_command(source, out) -> list[str]:
    code = "from zebra.cli.main import main; main()"
    return [sys.executable, "-c", code, "data", "prep", "--source", str(source), "--tokenizer", "byte",
            "--output", str(out), "--shards", str(SHARDS), "--workers", "2", "--yes"]  # fmt: skip


def _committed(out) -> tuple[int, bool]:
    try:
        m = json.loads((out / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):
        return 0, False
    return len(m["shards"]), m["complete"]


@pytest.mark.parametrize("kind", ["jsonl", "txt"])  # rows are lines of one file / files of a folder
def test_sigkill_mid_run_then_rerun_finishes_exactly(texts, tmp_path, kind):
    corpus = texts * 8  # 1,472 documents, 16 shards
    source = write_source(kind, tmp_path / "src", corpus)
    out = tmp_path / "out"
    env = os.environ | {"ZEBRA_YES": "1"}
    proc = subprocess.Popen(
        _prep_command(source, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 300
        while _committed(out)[0] < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        shards_at_kill, complete = _committed(out)
        proc.send_signal(signal.SIGKILL)  # the worker processes die with their pipe
    finally:
        proc.wait()
    assert 1 <= shards_at_kill < SHARDS and not complete, (
        shards_at_kill,
        proc.stderr.read().decode()[-2000:],
    )

    # the rerun in this process (the kill needed a process; the resume does not): one torch import fewer
    rerun = CliRunner().invoke(app, _prep_command(source, out)[3:], env={"ZEBRA_YES": "1"})
    assert rerun.exit_code == 0, rerun.output
    assert "resuming" in rerun.stdout
    manifest = read_manifest(out)
    assert manifest.complete and len(manifest.shards) == SHARDS
    assert [s.first_row for s in manifest.shards] == [
        i * manifest.config["rows_per_shard"] for i in range(SHARDS)
    ]
    assert sum(s.rows for s in manifest.shards) == len(corpus)
    assert read_all(out) == expected_ids("byte", corpus)  # every document once, in order
    assert not list(out.glob("*.tmp.*"))
