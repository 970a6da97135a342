"""Submitting a run's Slurm job through submitit, and registering it for `zebra jobs`.

The run directory must already be prepared, on a filesystem the nodes share; each task runs `SlurmTask`.
"""

from __future__ import annotations

import datetime
import shutil

from zebra.core.caches import without_torch_writes
from zebra.core.errors import ZebraError
from zebra.launch.jobs import JobRecord, add_job
from zebra.launch.plan import LaunchPlan
from zebra.launch.slurm_spec import SLURM_FIX, Sinfo, check_partition, parse_time, partitions
from zebra.launch.slurm_task import SlurmTask

MAX_REQUEUES = 100  # submitit's bound on time-limit requeues
UNLIMITED_MIN = 365 * 24 * 60  # what "no limit" becomes for submitit's bookkeeping


def require_slurm() -> None:
    """A one-line ZebraError unless the Slurm client commands and submitit are here."""
    missing = [c for c in ("sinfo", "sbatch", "srun", "squeue") if not shutil.which(c)]
    if missing:
        raise ZebraError(
            f"--launcher slurm: {', '.join(missing)} not found on PATH (no Slurm client here)", fix=SLURM_FIX
        )
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ZebraError("--launcher slurm needs submitit", fix="pip install 'zebra-llama[launch]'") from None


def partition_limit(partition: str | None, sinfo: Sinfo | None = None) -> int | None:
    """The time limit (minutes) of `partition` (default: the cluster's default one); None when unlimited."""
    rows = partitions(sinfo)
    check_partition(partition, rows)
    for name, limit in rows:
        if (partition and name.rstrip("*") == partition) or (not partition and name.endswith("*")):
            try:
                return parse_time(limit)
            except ValueError:
                return None
    return None


def submit(plan: LaunchPlan) -> JobRecord:
    """Submit `plan` (its run directory prepared, on a filesystem the nodes share) as one Slurm job and
    register it for `zebra jobs`."""
    require_slurm()
    import submitit

    spec = plan.slurm
    assert spec is not None, "a slurm plan has sbatch parameters"
    time_min = parse_time(spec.time) if spec.time else partition_limit(spec.partition, plan.sinfo)
    executor = submitit.SlurmExecutor(folder=spec.folder, max_num_timeout=MAX_REQUEUES)
    executor.update_parameters(**spec.executor_parameters(time_min or UNLIMITED_MIN))
    ranks = plan.run.ranks
    task = SlurmTask(
        run_dir=str(plan.run_dir),
        resume=plan.run.resume,
        device=ranks.device,
        ranks_per_node=ranks.ranks_per_node,
        container=plan.container.without_secret_values() if plan.container else None,
    )
    try:
        # the job inherits this environment through sbatch: less the defaults torch wrote into it here
        with without_torch_writes():
            job = executor.submit(task)
    except Exception as e:  # submitit raises FailedJobError with sbatch's stderr
        lines = (
            [s.strip() for s in str(e).splitlines() if "error" in s.lower()] or str(e).splitlines() or [""]
        )
        raise ZebraError(
            f"sbatch refused the job: {lines[-1][:300]}", fix="check the sbatch parameters with --dry-run"
        ) from None
    record = JobRecord(
        id=job.job_id,
        launcher="slurm",
        run_dir=str(plan.run_dir),
        recipe=plan.run.recipe.name,
        submitted=datetime.datetime.now().isoformat(timespec="seconds"),
        folder=spec.folder,
        logs=spec.logs(job.job_id),
        nodes=ranks.nodes,
        ranks=ranks.world_size,
    )
    add_job(record)
    return record
