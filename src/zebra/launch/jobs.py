"""The jobs zebra submitted: a small registry (`$ZEBRA_CACHE/jobs.json`, default ~/.cache/zebra/jobs.json,
rewritten atomically under a lock), their state, their logs, cancelling them.

State without accounting: `sacct` needs slurmdbd, which many clusters (and test machines) lack, so a job's
state comes from `squeue -t all` while the controller remembers it (running, pending, requeued, and finished
jobs for MinJobAge), then from the exit-code files each task writes (`slurm/<job>_<task>_exit.json`), then
from `scontrol show job`. A job nothing knows any more is `ENDED`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from zebra.core.atomic import write_atomic
from zebra.core.caches import make_cache_folder, zebra_cache_dir
from zebra.core.errors import ZebraError

FINISHED = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
    "PREEMPTED", "SPECIAL_EXIT", "REVOKED", "ENDED",
}  # fmt: skip
EXIT_NAME = "{job}_{task}_exit.json"  # each task's exit code, in the job's folder (RUN/slurm)


def exit_file(folder: str | Path, job_id: str, task: int) -> Path:
    """Where task `task` of job `job_id` writes its exit code (see `SlurmTask`)."""
    return Path(folder) / EXIT_NAME.format(job=job_id, task=task)


def registry_path() -> Path:
    return zebra_cache_dir() / "jobs.json"


@dataclass
class JobRecord:
    """One job zebra submitted."""

    id: str
    launcher: str  # slurm
    run_dir: str
    recipe: str
    submitted: str  # ISO time
    folder: str  # submitit's folder (RUN/slurm)
    logs: list[str]  # one per task, task 0 first
    nodes: int
    ranks: int


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    path = registry_path()
    make_cache_folder(path.parent)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path


def _read(path: Path) -> list[JobRecord]:
    if not path.is_file():
        return []
    try:
        rows = json.loads(path.read_text() or "[]")
        return [JobRecord(**row) for row in rows]
    except (ValueError, TypeError) as e:
        raise ZebraError(
            f"{path}: unreadable job registry ({e})", fix=f"delete {path} (it only lists jobs)"
        ) from None


def load_jobs() -> list[JobRecord]:
    """Every registered job, oldest first."""
    with _locked() as path:
        return _read(path)


def add_job(record: JobRecord) -> None:
    """Register `record` (replacing an entry with the same id)."""
    with _locked() as path:
        jobs = [j for j in _read(path) if j.id != record.id] + [record]
        write_atomic(path, json.dumps([asdict(j) for j in jobs], indent=1) + "\n")


def find_job(job_id: str | None) -> JobRecord:
    """The job `job_id` (None: the newest)."""
    jobs = load_jobs()
    if not jobs:
        raise ZebraError("no jobs submitted yet", fix="zebra train RECIPE --launcher slurm submits one")
    if job_id is None:
        return jobs[-1]
    for job in jobs:
        if job.id == job_id:
            return job
    raise ZebraError(f"job {job_id}: not started by zebra", fix="`zebra jobs list` shows the jobs it knows")


@dataclass
class JobStatus:
    state: str  # Slurm's state name, or ENDED when nothing remembers it
    reason: str
    exit_code: int | None  # of the first failing rank, 0 when all succeeded, None while running / unknown

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


def _squeue(job_id: str) -> tuple[str, str] | None:
    try:
        r = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
    if "|" not in line:
        return None
    state, reason = line.split("|", 1)
    return state.strip(), reason.strip()


def _task_exit_codes(job: JobRecord) -> dict[int, int]:
    codes = {}
    for path in Path(job.folder).glob(EXIT_NAME.format(job=job.id, task="*")):
        with contextlib.suppress(ValueError, OSError, KeyError):
            row = json.loads(path.read_text())
            codes[int(row["task"])] = int(row["exit_code"])
    return codes


def _scontrol_exit_code(job_id: str) -> int | None:
    try:
        r = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bExitCode=(\d+):(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        return None
    code, sig = int(m.group(1)), int(m.group(2))
    return code or (128 + sig if sig else 0)


def job_status(job: JobRecord) -> JobStatus:
    """Where `job` stands: the controller's view, then the tasks' exit-code files, then `scontrol`."""
    queued = _squeue(job.id)
    state, reason = queued if queued else ("ENDED", "")
    if state not in FINISHED:
        return JobStatus(state, reason, None)
    codes = _task_exit_codes(job)
    failed = [code for _, code in sorted(codes.items()) if code]
    if failed:
        exit_code = failed[0]
    elif codes and state in ("COMPLETED", "ENDED"):
        exit_code = 0
    else:
        exit_code = _scontrol_exit_code(job.id)
    if state == "ENDED" and exit_code is not None:
        state = "COMPLETED" if exit_code == 0 else "FAILED"
    return JobStatus(state, reason, exit_code)


def _copy_new(path: Path, offset: int, stream: BinaryIO) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    if data:
        stream.write(data)
        stream.flush()
    return offset + len(data)


def follow_log(
    job: JobRecord,
    stream: BinaryIO,
    *,
    task: int = 0,
    poll_s: float = 1.0,
    on_state: Callable[[JobStatus], None] | None = None,
) -> JobStatus | None:
    """Copy task `task`'s log to `stream` as it grows until the job finishes (through requeues): its status,
    or None when Ctrl-C stopped the following (the job runs on)."""
    log = Path(job.logs[task])
    offset, last = 0, None
    try:
        while True:
            status = job_status(job)
            offset = _copy_new(log, offset, stream)
            if on_state and status.state != last:
                on_state(status)
                last = status.state
            if status.finished:
                time.sleep(poll_s)  # the last lines may land after the controller saw the end
                _copy_new(log, offset, stream)
                return status
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return None


def check_finished(job: JobRecord, status: JobStatus) -> None:
    """Raise a ZebraError (with the failing rank's exit code) unless the job completed."""
    if status.state == "COMPLETED" and not status.exit_code:
        return
    raise ZebraError(
        f"job {job.id} ended {status.state}"
        + (f" (exit code {status.exit_code})" if status.exit_code else ""),
        fix=f"its log: {job.logs[0]}",
        exit_code=status.exit_code or 1,
    )


def cancel(job: JobRecord) -> JobStatus | None:
    """`scancel` the job: its ranks get SIGTERM and save a checkpoint before they stop. Returns None, or the
    status of a job that had already ended, which is left alone (scancel succeeds on a finished job the
    controller still remembers, so it cannot tell)."""
    status = job_status(job)
    if status.finished:
        return status
    try:
        r = subprocess.run(["scancel", job.id], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise ZebraError(f"scancel could not run: {e}", fix="run on the cluster's login node") from None
    if r.returncode != 0:
        raise ZebraError(f"scancel {job.id} failed: {(r.stderr or r.stdout).strip()[:200]}")
    return None
