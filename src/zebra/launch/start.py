"""Starting a launch plan, whatever its launcher: `check_launcher` before anything is written, then `start`.

    plan = make_plan(recipe, nproc=2)
    check_launcher(plan)                   # the Docker engine and image, or the Slurm client, are there
    with hold_run_dir(plan) as lock:       # RUN/.lock: no other run writes into the run directory
        prepare_run(plan.run)              # RUN/config.yaml
        outcome = start(plan, Callbacks(log=print), follow=True, lock=lock)

`start` reports through `Callbacks` while the ranks run (the CLI renders them) and returns an `Outcome`;
a failing run raises a ZebraError with the failing rank's exit code.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from zebra.core.errors import ZebraError
from zebra.core.locks import FolderLock
from zebra.launch.docker import check_docker, run_docker
from zebra.launch.jobs import JobRecord, JobStatus, check_finished, follow_log, job_status, load_jobs
from zebra.launch.local import run_local
from zebra.launch.plan import LaunchPlan
from zebra.launch.slurm_spec import check_partition
from zebra.launch.slurm_submit import require_slurm, submit
from zebra.train.run import run_lock
from zebra.train.view import TrainView


def _ignore(*_event) -> None:
    pass


@dataclass
class Callbacks:
    """What `start` tells its caller while the ranks run (the defaults print plain lines, show no training)."""

    log: Callable[[str], None] = print  # the launcher's own messages (pulling an image, stopping a container)
    output: BinaryIO | None = None  # where the ranks' output goes when it passes through here; None: stdout
    training: TrainView = field(default_factory=TrainView)  # the progress of a rank training in this process
    submitted: Callable[[JobRecord], None] = _ignore  # a Slurm job was submitted (before it is followed)
    job_state: Callable[[JobRecord, JobStatus], None] = _ignore  # a followed Slurm job changed state


@dataclass
class Outcome:
    """How a started run went, as far as this process saw it."""

    stopped_by: str | None = None  # the stop signal that ended the ranks early (they saved a checkpoint)
    job: JobRecord | None = None  # slurm: the submitted job
    status: JobStatus | None = None  # slurm, followed: how the job ended

    @property
    def ended(self) -> bool:
        """The ranks ended while this process watched: always, except a Slurm job not followed to its end."""
        return self.job is None or self.status is not None


def check_launcher(
    plan: LaunchPlan,
    log: Callable[[str], None] = print,
    progress: Callable[[float, float], None] | None = None,
) -> None:
    """Fail early, before the run directory is written: the Docker engine and the image are there (pulled
    if needed, reporting `progress(done_mb, total_mb)`) and no container runs this run already, or the Slurm
    client commands are and the cluster has the partition (sinfo's answer, asked once per launch: `plan.sinfo`;
    a controller that does not answer is an error here, where the plan let it pass)."""
    if plan.launcher == "docker":
        check_docker(plan.image or "", log, progress, plan.container.name if plan.container else None)
    elif plan.launcher == "slurm":
        require_slurm()
        check_partition(plan.slurm.partition if plan.slurm else None, sinfo=plan.sinfo)


@contextlib.contextmanager
def hold_run_dir(plan: LaunchPlan) -> Iterator[FolderLock | None]:
    """Hold the run directory's lock (`RUN/.lock`) in this process while the run is prepared and started.

    Yields None for a run over several nodes started on each node by hand (every node runs the same command).

    Raises:
        ZebraError: another run holds the lock (named), or a Slurm job zebra submitted for this run directory
            is still queued or running.
    """
    if plan.launcher != "slurm" and plan.run.ranks.nodes > 1:
        yield None
        return
    with run_lock(plan.run_dir) as lock:
        _refuse_queued_jobs(plan.run_dir)
        yield lock


def _refuse_queued_jobs(run_dir: Path) -> None:
    """A queued job holds no lock yet (its task 0 takes it when it starts): ask the job registry instead."""
    for job in load_jobs():
        if Path(job.run_dir) == run_dir and not (status := job_status(job)).finished:
            raise ZebraError(
                f"{run_dir}: in use by Slurm job {job.id} ({status.state})",
                fix=f"wait for it to end, or `zebra jobs cancel {job.id}`; or pass --run NAME for another run",
            )


def start(
    plan: LaunchPlan,
    callbacks: Callbacks | None = None,
    *,
    follow: bool = False,
    lock: FolderLock | None = None,
) -> Outcome:
    """Start the ranks of `plan` (its run directory prepared): local and docker runs to their end, a Slurm
    job submitted (and with `follow` followed to its end, task 0's log copied to `callbacks.output`; Ctrl-C
    stops the following, not the job).

    Args:
        lock: the run directory's lock (`hold_run_dir`); a Slurm run releases it once the job is submitted, as
            the job's task 0 takes it when it starts.

    Raises:
        ZebraError: the run failed; the failing rank's exit code becomes the error's.
    """
    cb = callbacks or Callbacks()
    if plan.launcher == "local":
        return Outcome(stopped_by=run_local(plan.run, cb.training))
    if plan.launcher == "docker":
        assert plan.container is not None, "a docker plan has a container"
        return Outcome(stopped_by=run_docker(plan.container, cb.log, cb.output))
    job = submit(plan)
    if lock is not None:
        lock.release()
    cb.submitted(job)
    if not follow:
        return Outcome(job=job)
    status = follow_log(job, cb.output or sys.stdout.buffer, on_state=lambda state: cb.job_state(job, state))
    if status is not None:
        check_finished(job, status)
    return Outcome(job=job, status=status)
