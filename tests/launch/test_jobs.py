"""The job registry and job states without accounting: squeue while Slurm remembers a job, then the exit-code
files the tasks write."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from zebra.launch import jobs
from zebra.launch.jobs import JobRecord


def record(tmp_path, job_id: str, tasks: int = 2) -> JobRecord:
    folder = tmp_path / "run" / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    return JobRecord(
        id=job_id, launcher="slurm", run_dir=str(tmp_path / "run"), recipe="tiny", submitted="2026-01-01T00:00:00",
        folder=str(folder), logs=[str(folder / f"{job_id}_{t}_log.out") for t in range(tasks)], nodes=1, ranks=tasks,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEBRA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "jobs.json"


def test_registry_keeps_every_job_under_concurrent_writers(tmp_path, registry):
    threads = [
        threading.Thread(target=jobs.add_job, args=(record(tmp_path, str(900000 + i)),)) for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(j.id for j in jobs.load_jobs()) == [str(900000 + i) for i in range(8)]
    assert json.loads(registry.read_text())  # valid JSON, no temp file left behind
    assert [p.name for p in registry.parent.iterdir() if p.name.endswith(".tmp")] == []
    assert jobs.find_job(None).id in {str(900000 + i) for i in range(8)}


def test_unknown_job_and_empty_registry_are_one_line_errors(tmp_path):
    from zebra.core.errors import ZebraError

    with pytest.raises(ZebraError, match="no jobs submitted yet"):
        jobs.find_job(None)
    jobs.add_job(record(tmp_path, "900001"))
    with pytest.raises(ZebraError, match="job 77: not started by zebra"):
        jobs.find_job("77")


def write_exit(job: JobRecord, task: int, code: int) -> None:
    (Path(job.folder) / f"{job.id}_{task}_exit.json").write_text(
        json.dumps({"exit_code": code, "task": task})
    )


@pytest.mark.parametrize(("codes", "state", "exit_code"), [([0, 0], "COMPLETED", 0), ([0, 3], "FAILED", 3)])
def test_state_of_a_forgotten_job_comes_from_the_exit_files(tmp_path, codes, state, exit_code):
    job = record(tmp_path, "987654321")  # no controller knows this id
    for task, code in enumerate(codes):
        write_exit(job, task, code)
    status = jobs.job_status(job)
    assert (status.state, status.exit_code, status.finished) == (state, exit_code, True)


def test_a_job_nothing_knows_has_ended_with_no_exit_code(tmp_path):
    status = jobs.job_status(record(tmp_path, "987654322"))
    assert (status.state, status.exit_code, status.finished) == ("ENDED", None, True)


def test_jobs_cli_lists_and_prints_logs(tmp_path, cli):
    job = record(tmp_path, "987654323")
    jobs.add_job(job)
    write_exit(job, 0, 0)
    write_exit(job, 1, 0)
    Path(job.logs[1]).write_text("step 6/6 | loss 5.1\n")
    listed = json.loads(cli("jobs", "list", "--json").stdout)
    assert [(r["id"], r["state"], r["exit_code"], r["ranks"]) for r in listed] == [
        ("987654323", "COMPLETED", 0, "1x2")
    ]
    result = cli("jobs", "logs", "987654323", "--task", "1")
    assert result.exit_code == 0 and result.stdout == "step 6/6 | loss 5.1\n"
    missing = cli("jobs", "logs", "987654323")  # task 0 wrote no log
    assert missing.exit_code == 1 and "no log yet" in missing.stderr
    assert cli("jobs", "logs", "--task", "5").exit_code == 1


def test_cancelling_a_job_that_ended_cancels_nothing(tmp_path, cli):
    job = record(tmp_path, "987654324")  # no controller knows this id: its state comes from the exit files
    jobs.add_job(job)
    write_exit(job, 0, 0)
    write_exit(job, 1, 0)
    result = cli("jobs", "cancel", "987654324")
    assert result.exit_code == 0, result.output
    assert "job 987654324 already ended (COMPLETED): nothing cancelled" in result.stdout
    assert "✓" not in result.stdout


@pytest.mark.infra
def test_cancelling_a_completed_job_the_controller_remembers_cancels_nothing(tmp_path, cli, slurm_cluster):
    """scancel returns 0 for a finished job that squeue still lists (MinJobAge), so zebra asks first."""
    submitted = subprocess.run(
        ["sbatch", "--parsable", "-p", slurm_cluster, "-o", str(tmp_path / "%j.out"), "--wrap", "true"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 120
        while (state := jobs._squeue(job_id)) is None or state[0] != "COMPLETED":
            assert time.monotonic() < deadline, f"job {job_id} did not complete: {state}"
            time.sleep(0.5)
        jobs.add_job(record(tmp_path, job_id))
        result = cli("jobs", "cancel", job_id)
        assert result.exit_code == 0, result.output
        assert f"job {job_id} already ended (COMPLETED): nothing cancelled" in result.stdout
        assert "✓ cancelled" not in result.stdout
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
