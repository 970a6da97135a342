"""Start a launch plan with the docker or slurm launcher (the local one is `zebra.train.launch.launch_local`)."""

from __future__ import annotations

import datetime
from collections.abc import Callable

from zebra.errors import ZebraError
from zebra.launch.jobs import JobRecord, JobStatus, add_job
from zebra.launch.plan import LaunchPlan


def check_launcher(
    plan: LaunchPlan,
    log: Callable[[str], None] = print,
    progress: Callable[[float, float], None] | None = None,
) -> None:
    """Fail early, before the run directory is written: the Docker engine and the image are there (pulled
    if needed, reporting `progress(done_mb, total_mb)`), or the Slurm client commands are."""
    if plan.launcher == "docker":
        from zebra.launch.container import docker_client, ensure_image

        client = docker_client()
        try:
            ensure_image(client, plan.image or "", log, progress)
        finally:
            client.close()
    elif plan.launcher == "slurm":
        from zebra.launch.slurm import require_slurm

        require_slurm()


def run_docker(plan: LaunchPlan, log: Callable[[str], None] = print) -> str | None:
    """Run the plan's container in the foreground; the signal that stopped it early (it saved), or None.

    Raises:
        ZebraError: the engine, the image or the container failed; a failing run's exit code becomes the
        error's.
    """
    from zebra.launch.container import run_container

    assert plan.container is not None, "a docker plan has a container"
    outcome = run_container(plan.container, log=log)
    if outcome.exit_code:
        raise ZebraError(
            f"training in container {plan.container.name} ({plan.container.image}) failed with exit code "
            f"{outcome.exit_code}",
            fix="its output is above" if not outcome.stopped_by else "it was killed before it saved",
            exit_code=outcome.exit_code,
        )
    return outcome.stopped_by


def submit_slurm(plan: LaunchPlan) -> JobRecord:
    """Submit the plan as one Slurm job and register it for `zebra jobs`."""
    from zebra.launch.slurm import submit

    job = submit(plan)
    record = JobRecord(
        id=job.job_id,
        launcher="slurm",
        run_dir=str(plan.run_dir),
        recipe=plan.recipe,
        submitted=datetime.datetime.now().isoformat(timespec="seconds"),
        folder=job.folder,
        logs=job.logs,
        nodes=plan.nodes,
        ranks=plan.world_size,
    )
    add_job(record)
    return record


def check_finished(job: JobRecord, status: JobStatus) -> None:
    """Raise a ZebraError (with the failing rank's exit code) unless the job completed."""
    if status.state == "COMPLETED" and not status.exit_code:
        return
    code = status.exit_code or 1
    raise ZebraError(
        f"job {job.id} ended {status.state}"
        + (f" (exit code {status.exit_code})" if status.exit_code else ""),
        fix=f"its log: {job.logs[0]}",
        exit_code=code,
    )
