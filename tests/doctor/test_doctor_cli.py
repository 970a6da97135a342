"""`zebra doctor` end to end: every check runs on this machine, JSON for scripts, exit 1 on a failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app
from zebra.core.errors import ZebraError
from zebra.doctor import CHECK_NAMES, promote, run_checks
from zebra.doctor.check import fail, ok, warn
from zebra.doctor.run import _guarded

runner = CliRunner()


SECRET = "hf_zebraSecretNeverPrinted123"


def doctor_json(*args, env=None):
    result = runner.invoke(app, ["doctor", "--json", *args], env=env)
    return result, json.loads(result.stdout)


# Each doctor run asks every service (an unreachable Slurm controller alone takes ~9 s to answer): the tests below
# read three runs, made once for the module, instead of one run each.
@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """`zebra doctor --json` on this machine as it is."""
    return doctor_json("--data-dir", str(tmp_path_factory.mktemp("plain")))


@pytest.fixture(scope="module")
def flagged(tmp_path_factory):
    """`zebra doctor --json --require docker --sample 350BT` with Docker unreachable and HF_TOKEN set."""
    folder = tmp_path_factory.mktemp("flagged")
    env = {"DOCKER_HOST": f"unix://{folder}/none.sock", "HF_TOKEN": SECRET}
    return doctor_json("--require", "docker", "--sample", "350BT", "--data-dir", str(folder), env=env)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """`zebra doctor` (a table, 80 columns) with Docker unreachable and HF_TOKEN set."""
    folder = tmp_path_factory.mktemp("table")
    env = {"DOCKER_HOST": f"unix://{folder}/none.sock", "COLUMNS": "80", "HF_TOKEN": SECRET}
    return runner.invoke(app, ["doctor", "--data-dir", str(folder)], env=env)


def test_every_check_runs_in_order(plain):
    _, data = plain
    assert tuple(c["name"] for c in data["checks"]) == CHECK_NAMES
    for c in data["checks"]:
        assert c["status"] in ("ok", "warn", "fail") and c["detail"]
        if c["status"] == "fail":
            assert c["fix"]


def test_json_on_this_machine_reports_and_exits_by_failures(plain):
    result, data = plain
    statuses = {c["name"]: c["status"] for c in data["checks"]}
    assert list(statuses) == list(CHECK_NAMES)
    assert data["counts"]["fail"] == sum(s == "fail" for s in statuses.values())
    assert result.exit_code == (1 if data["counts"]["fail"] else 0)
    assert data["ok"] == (data["counts"]["fail"] == 0)
    import torch

    if not torch.cuda.is_available():  # the CPU machine: GPU checks are absent, not crashes
        assert statuses["gpu"] == "warn" and statuses["nccl-env"] == "warn"
        assert statuses["fla-triton-hopper"] == "ok"


def test_required_docker_fails_the_run_when_unreachable(flagged):
    result, data = flagged
    docker = next(c for c in data["checks"] if c["name"] == "docker")
    assert docker["status"] == "fail"
    assert result.exit_code == 1


def test_sample_sets_the_disk_need(flagged):
    _, data = flagged
    disk = next(c for c in data["checks"] if c["name"] == "disk")
    assert "--sample 350BT needs about 1,750 GB" in disk["detail"]


def test_table_output_lists_checks_and_fixes(table):
    assert "fla-triton-hopper" in table.stdout
    assert "To fix:" in table.stdout and "docker: start the engine" in table.stdout
    assert " ok, " in table.stdout and " fail" in table.stdout
    fixes = table.stdout.split("To fix:\n")[1].splitlines()[:-1]  # then the counts line
    assert fixes and all(line.startswith(("  ok ", "  warn ", "  fail ")) for line in fixes), (
        fixes
    )  # each one line
    assert max(len(line) for line in fixes) > 80  # a command to copy is not broken at the terminal's width


def test_hf_token_never_reaches_the_output(table, flagged):
    assert "HF_TOKEN is set" in table.stdout
    assert SECRET not in table.output
    result, data = flagged
    assert next(c for c in data["checks"] if c["name"] == "hf-token")["status"] == "ok"
    assert SECRET not in result.output and SECRET not in json.dumps(data)


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["--require", "dockr"], "error: --require dockr: unknown check", "did you mean 'docker'?"),
        (["--sample", "5BT"], "error: --sample 5BT: unknown sample", "10BT, 100BT, 350BT"),
    ],
)
def test_bad_flags_are_one_line_errors(args, message, hint):
    r = subprocess.run(
        [sys.executable, "-c", "from zebra.cli.main import main; main()", "doctor", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[0] == message and hint in lines[1]
    assert "Traceback" not in r.stderr


def test_require_accepts_comma_lists():
    with pytest.raises(ZebraError, match="--require slrum: unknown check"):
        run_checks(required=["docker,slrum"])


def test_promote_only_turns_named_warnings_into_failures():
    checks = [warn("docker", "down"), warn("slurm", "down"), ok("gpu", "fine"), fail("torch", "gone")]
    promoted = promote(checks, ["docker", "gpu"])
    assert [c.status for c in promoted] == ["fail", "warn", "ok", "fail"]


def test_a_crashing_check_becomes_a_failed_row(monkeypatch):
    monkeypatch.delenv("ZEBRA_DEBUG", raising=False)
    (row,) = _guarded("disk", lambda: 1 / 0)
    assert row.status == "fail" and "ZeroDivisionError" in row.detail and "ZEBRA_DEBUG=1" in row.fix
    monkeypatch.setenv("ZEBRA_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        _guarded("disk", lambda: 1 / 0)
