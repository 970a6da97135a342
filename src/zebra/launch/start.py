"""Starting a launch plan, whatever its launcher: `check_launcher` before anything is written, then `start`.

    plan = make_plan(recipe, nproc=2)
    check_launcher(plan)                   # the Docker engine and image, or the Slurm client, are there
    prepare_run(plan.run)                  # RUN/config.yaml
    outcome = start(plan, Callbacks(log=print), follow=True)

`start` reports through `Callbacks` while the ranks run (the CLI renders them) and returns an `Outcome`;
a failing run raises a ZebraError with the failing rank's exit code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from zebra.launch.docker import check_docker, run_docker
from zebra.launch.jobs import JobRecord, JobStatus, check_finished, follow_log
from zebra.launch.local import run_local
from zebra.launch.plan import LaunchPlan
from zebra.launch.slurm_submit import require_slurm, submit
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
    client commands are."""
    if plan.launcher == "docker":
        check_docker(plan.image or "", log, progress, plan.container.name if plan.container else None)
    elif plan.launcher == "slurm":
        require_slurm()


def start(plan: LaunchPlan, callbacks: Callbacks | None = None, *, follow: bool = False) -> Outcome:
    """Start the ranks of `plan` (its run directory prepared): local and docker runs to their end, a Slurm
    job submitted (and with `follow` followed to its end, task 0's log copied to `callbacks.output`; Ctrl-C
    stops the following, not the job).

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
    cb.submitted(job)
    if not follow:
        return Outcome(job=job)
    status = follow_log(job, cb.output or sys.stdout.buffer, on_state=lambda state: cb.job_state(job, state))
    if status is not None:
        check_finished(job, status)
    return Outcome(job=job, status=status)
