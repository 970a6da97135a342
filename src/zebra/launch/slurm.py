"""The Slurm launcher, through submitit: one task per rank (one per GPU), or with `launch.container` one task
per node whose container starts that node's ranks with torchrun.

Each task runs `SlurmTask` (pickled by submitit into the run's `slurm/` folder): it takes its place in the job
from Slurm (`submitit.helpers.TorchDistributedEnvironment`), starts the rank entry
`python -m zebra.train.entry RUN_DIR` (or the node's container) and waits for it.

Pre-emption and time limits: sbatch asks Slurm for USR2 `SIGNAL_DELAY_S` before the limit; submitit calls
`SlurmTask.checkpoint()` in task 0, which stops the ranks with SIGTERM (the trainer saves a checkpoint and
exits 0) and hands back the same task with `--resume auto`; submitit then requeues the job. A job that Slurm
itself requeues (pre-emption, `scontrol requeue`) restarts with SLURM_RESTART_COUNT > 0 and also resumes.
Each task writes its rank's exit code to `slurm/<job>_<task>_exit.json`, which `zebra jobs` reads when
accounting (sacct) is not there.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.errors import ZebraError

if TYPE_CHECKING:
    from zebra.launch.container import ContainerSpec
    from zebra.launch.plan import LaunchPlan
    from zebra.recipes import LaunchSpec

POLL_S = 0.5
SIGNAL_DELAY_S = 120  # USR2 this long before the time limit: time to save a checkpoint
MAX_REQUEUES = 100  # submitit's bound on time-limit requeues
UNLIMITED_MIN = 365 * 24 * 60  # what "no limit" becomes for submitit's bookkeeping
SLURM_FIX = (
    "run on the cluster's login node (sinfo, sbatch and squeue must be on PATH), or use --launcher local"
)
# Flags zebra sets itself: --sbatch-extra may not give them.
RESERVED = {
    "nodes": "--nodes",
    "N": "--nodes",
    "ntasks": "--gpus / --nproc",
    "ntasks-per-node": "--gpus / --nproc",
    "gpus-per-node": "--gpus",
    "gpus": "--gpus",
    "partition": "--partition",
    "p": "--partition",
    "account": "--account",
    "A": "--account",
    "qos": "--qos",
    "time": "--time",
    "t": "--time",
    "cpus-per-task": "--set launch.cpus_per_task=N",
    "job-name": "--run",
    "output": "(logs go to RUN/slurm/)",
    "error": "(logs go to RUN/slurm/)",
    "signal": "(USR2 before the limit is zebra's)",
    "open-mode": "(logs are appended across requeues)",
    "array": "(one job per run)",
}


def parse_time(text: str) -> int | None:
    """Slurm's time formats (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`) -> minutes, rounded
    up; None for `infinite` / `UNLIMITED`. Raises ValueError for anything else."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise ValueError(text)
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # MM[:SS]
        seconds = int(a) * 60 + int(b or 0)
    if seconds <= 0:
        raise ValueError(text)
    return math.ceil(seconds / 60)


def parse_sbatch_extra(flags: list[str]) -> dict[str, str | bool]:
    """`["--exclusive", "--mem=0", "--constraint=mi300x"]` -> `{"exclusive": True, "mem": "0", ...}`."""
    parsed: dict[str, str | bool] = {}
    for flag in flags:
        m = re.fullmatch(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(.*))?", flag.strip())
        if not m:
            raise ZebraError(
                f"--sbatch-extra {flag!r}: expected --name or --name=value",
                fix="write long sbatch flags, e.g. --sbatch-extra=--exclusive --sbatch-extra=--mem=0",
            )
        key, value = m.group(1), m.group(2)
        if key in RESERVED:
            raise ZebraError(
                f"--sbatch-extra {flag!r}: zebra sets --{key} itself", fix=f"use {RESERVED[key]}"
            )
        parsed[key] = True if value is None else value
    return parsed


@dataclass
class SlurmSpec:
    """The sbatch parameters of one run's job (submitit writes them as #SBATCH lines)."""

    job_name: str
    nodes: int
    ntasks_per_node: int
    gpus_per_node: int | None
    cpus_per_task: int | None
    partition: str | None
    account: str | None
    qos: str | None
    time: str | None  # as given; None: the partition's limit, looked up at submission
    extra: dict[str, str | bool] = field(default_factory=dict)
    folder: str = ""
    container: bool = False

    @property
    def log_pattern(self) -> str:
        """Each task's log (stdout and stderr): %j the job id, %t the task."""
        return str(Path(self.folder) / "%j_%t_log.out")

    def executor_parameters(self, time_min: int) -> dict[str, Any]:
        """`submitit.SlurmExecutor.update_parameters` arguments."""
        params: dict[str, Any] = dict(
            job_name=self.job_name,
            nodes=self.nodes,
            ntasks_per_node=self.ntasks_per_node,
            time=time_min,
            signal_delay_s=SIGNAL_DELAY_S,
            stderr_to_stdout=True,
            wckey=None,  # submitit's default "submitit" is refused where WCKeys are tracked
        )
        optional = dict(
            gpus_per_node=self.gpus_per_node,
            cpus_per_task=self.cpus_per_task,
            partition=self.partition,
            account=self.account,
            qos=self.qos,
        )
        params.update({k: v for k, v in optional.items() if v})
        if self.extra:
            params["additional_parameters"] = dict(self.extra)
        return params

    def describe(self) -> dict[str, Any]:
        sbatch: dict[str, Any] = {
            "job-name": self.job_name,
            "nodes": self.nodes,
            "ntasks-per-node": self.ntasks_per_node,
            "gpus-per-node": self.gpus_per_node,
            "cpus-per-task": self.cpus_per_task,
            "partition": self.partition,
            "account": self.account,
            "qos": self.qos,
            "time": self.time or "the partition's limit",
            "signal": f"USR2@{SIGNAL_DELAY_S}",
            "output": self.log_pattern,
            "open-mode": "append",
            **self.extra,
        }
        return {
            "sbatch": {k: v for k, v in sbatch.items() if v is not None},
            "tasks": self.nodes * self.ntasks_per_node,
            "task_runs": "one node's container (torchrun)" if self.container else "one rank",
            "folder": self.folder,
            "logs": self.log_pattern,
            "requeue": f"USR2 {SIGNAL_DELAY_S}s before the limit: save, requeue, --resume auto",
        }


def slurm_spec(plan: LaunchPlan, spec: LaunchSpec) -> SlurmSpec:
    """The sbatch parameters of `plan`: one task per rank (one per GPU), or one per node with a container."""
    if spec.time:
        try:
            parse_time(spec.time)
        except ValueError:
            raise ZebraError(
                f"--time {spec.time!r}: not a Slurm time", fix="use MM, HH:MM:SS or D-HH:MM:SS, e.g. 24:00:00"
            ) from None
    tasks = 1 if spec.container else plan.ranks_per_node
    cpus = spec.cpus_per_task or (None if plan.device == "cuda" else 1)
    if spec.container and plan.device == "cpu" and not spec.cpus_per_task:
        cpus = plan.ranks_per_node
    return SlurmSpec(
        job_name=f"zebra-{plan.run_dir.name}",
        nodes=plan.nodes,
        ntasks_per_node=tasks,
        gpus_per_node=plan.gpus_per_node or None,
        cpus_per_task=cpus,
        partition=spec.partition or None,
        account=spec.account or None,
        qos=spec.qos or None,
        time=spec.time or None,
        extra=parse_sbatch_extra(spec.sbatch_extra),
        folder=str(plan.run_dir / "slurm"),
        container=spec.container,
    )


def require_slurm() -> None:
    """A one-line ZebraError unless the Slurm client commands and submitit are here."""
    missing = [c for c in ("sbatch", "srun", "squeue") if not shutil.which(c)]
    if missing:
        raise ZebraError(
            f"--launcher slurm: {', '.join(missing)} not found on PATH (no Slurm client here)", fix=SLURM_FIX
        )
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ZebraError("--launcher slurm needs submitit", fix="pip install 'zebra-llama[launch]'") from None


def partition_limit(partition: str | None) -> int | None:
    """The time limit (minutes) of `partition` (default: the cluster's default one); None when unlimited."""
    r = subprocess.run(["sinfo", "-h", "-o", "%P %l"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise ZebraError(f"sinfo failed: {(r.stderr or r.stdout).strip()[:200]}", fix=SLURM_FIX)
    rows = [line.split() for line in r.stdout.splitlines() if len(line.split()) == 2]
    for name, limit in rows:
        if (partition and name.rstrip("*") == partition) or (not partition and name.endswith("*")):
            try:
                return parse_time(limit)
            except ValueError:
                return None
    if partition:
        names = ", ".join(n.rstrip("*") for n, _ in rows)
        raise ZebraError(f"--partition {partition}: no such partition", fix=f"pick one of: {names}")
    return None


@dataclass
class SubmittedJob:
    job_id: str
    folder: str
    logs: list[str]  # one per task; task 0's first


def submit(plan: LaunchPlan) -> SubmittedJob:
    """Submit `plan` (its run directory prepared, on a filesystem the nodes share) as one Slurm job."""
    require_slurm()
    import submitit

    spec = plan.slurm
    assert spec is not None, "a slurm plan has sbatch parameters"
    time_min = parse_time(spec.time) if spec.time else partition_limit(spec.partition)
    executor = submitit.SlurmExecutor(folder=spec.folder, max_num_timeout=MAX_REQUEUES)
    executor.update_parameters(**spec.executor_parameters(time_min or UNLIMITED_MIN))
    task = SlurmTask(
        run_dir=str(plan.run_dir),
        resume=plan.resume,
        device=plan.device,
        ranks_per_node=plan.ranks_per_node,
        container=plan.container.without_secret_values() if plan.container else None,
    )
    try:
        job = executor.submit(task)
    except Exception as e:  # submitit raises FailedJobError with sbatch's stderr
        lines = (
            [s.strip() for s in str(e).splitlines() if "error" in s.lower()] or str(e).splitlines() or [""]
        )
        raise ZebraError(
            f"sbatch refused the job: {lines[-1][:300]}", fix="check the sbatch parameters with --dry-run"
        ) from None
    tasks = spec.nodes * spec.ntasks_per_node
    logs = [str(Path(spec.folder) / f"{job.job_id}_{t}_log.out") for t in range(tasks)]
    return SubmittedJob(job.job_id, spec.folder, logs)


def exit_file(folder: str | Path, job_id: str, task: int) -> Path:
    return Path(folder) / f"{job_id}_{task}_exit.json"


@dataclass
class SlurmTask:
    """What each Slurm task runs (pickled by submitit): one rank, or one node's container."""

    run_dir: str
    resume: str
    device: str
    ranks_per_node: int
    container: ContainerSpec | None = None

    def __call__(self) -> int:
        import submitit

        job = submitit.JobEnvironment()
        dist = submitit.helpers.TorchDistributedEnvironment()
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        resume = "auto" if restarts else self.resume
        done = exit_file(job.paths.folder, job.job_id, job.global_rank)
        done.unlink(missing_ok=True)
        print(
            f"zebra: task {job.global_rank} of job {job.job_id} on {job.hostname} (restart {restarts})",
            flush=True,
        )
        if self.container is None:
            code = self._run_rank(dist, resume)
        else:
            code = self._run_container(job, dist, resume)
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps({"exit_code": code, "task": job.global_rank, "restarts": restarts}))
        tmp.replace(done)
        if code:
            sys.exit(code)  # the task (and the job) fails with the rank's code
        return code

    def _run_rank(self, dist, resume: str) -> int:
        from zebra.train.launch import rank_command, rank_env

        threads = int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0) or None
        env = {
            **os.environ,
            **rank_env(
                rank=dist.rank,
                local_rank=dist.local_rank,
                world_size=dist.world_size,
                local_world_size=dist.local_world_size,
                master_addr=dist.master_addr,
                master_port=dist.master_port,
                threads=threads,
            ),
            "PYTHONUNBUFFERED": "1",
        }
        import submitit

        # Slurm delivers submitit's requeue signal (USR2) to every process of the step: the rank ignores it,
        # this task's checkpoint() stops the rank with SIGTERM instead.
        requeue_signal = getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)
        child = subprocess.Popen(
            rank_command(self.run_dir, resume=resume, device=self.device),
            env=env,
            preexec_fn=lambda: signal.signal(requeue_signal, signal.SIG_IGN),
        )
        exit_codes: list[int] = []
        # Popen.wait holds a lock that a signal handler's wait would deadlock on: wait in a thread, poll here.
        threading.Thread(target=lambda: exit_codes.append(child.wait()), daemon=True).start()

        def wait() -> int:
            while not exit_codes:
                time.sleep(POLL_S)
            return exit_codes[0]

        self._stop = lambda: child.send_signal(signal.SIGTERM)
        self._wait = wait
        return wait()

    def _run_container(self, job, dist, resume: str) -> int:
        from zebra.launch.container import start_container, stop_and_wait
        from zebra.train.launch import torchrun_command

        spec = self.container
        command = torchrun_command(
            self.run_dir,
            nproc_per_node=self.ranks_per_node,
            nnodes=job.num_nodes,
            rdzv_endpoint=f"{dist.master_addr}:{dist.master_port}",
            resume=resume,
            device=self.device,
            python=spec.python,
        )
        name = f"zebra-{job.job_id}-node{job.node}"
        node_spec = replace(
            spec, command=command, name=name, labels={**spec.labels, "zebra.slurm_job": job.job_id}
        )
        running = start_container(node_spec, log=lambda m: print(m, flush=True))
        stop_requested: list[int] = []
        # Slurm signals this task's processes, not the container's: forward SIGTERM (the ranks save).
        signal.signal(signal.SIGTERM, lambda signum, _frame: stop_requested.append(signum))
        self._stop = lambda: None
        self._wait = lambda: stop_and_wait(name)
        try:
            forwarded = False
            while not running.exited():
                if stop_requested and not forwarded:
                    running.signal("SIGTERM")
                    forwarded = True
                time.sleep(POLL_S)
            return running.exit_code()
        finally:
            running.remove()

    def checkpoint(self):
        """Called by submitit in task 0 on USR2 (pre-emption, time limit): stop the ranks so that they save,
        and return the task to requeue, resuming from that checkpoint."""
        import submitit

        stop, wait = getattr(self, "_stop", None), getattr(self, "_wait", None)
        if stop is not None:
            print(
                "zebra: pre-empted or near the time limit: saving a checkpoint before the requeue", flush=True
            )
            stop()
            wait()
        return submitit.helpers.DelayedSubmission(replace(self, resume="auto"))
