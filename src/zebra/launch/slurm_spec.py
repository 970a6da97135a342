"""The sbatch parameters of a run's Slurm job (`SlurmSpec`): one task per rank (one per GPU), or with
`launch.container` one task per node; the time limit, the log files, the requeue signal and the extra flags.
`zebra.launch.slurm_submit` hands them to submitit, which writes them as #SBATCH lines.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebra.core.errors import ZebraError
from zebra.train.run import TrainRun

SIGNAL_DELAY_S = 120  # USR2 this long before the time limit: time to save a checkpoint
LOG_NAME = "{job}_{task}_log.out"  # each task's log (stdout and stderr) in the run's slurm/ folder
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


def _sinfo(fields: str) -> list[str]:
    """The lines of `sinfo --all -h -o FIELDS` (every partition, hidden ones too), or a one-line ZebraError."""
    try:
        r = subprocess.run(["sinfo", "--all", "-h", "-o", fields], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise ZebraError(f"sinfo could not run: {e}", fix=SLURM_FIX) from None
    if r.returncode != 0:
        raise ZebraError(f"sinfo failed: {(r.stderr or r.stdout).strip()[:200]}", fix=SLURM_FIX)
    return r.stdout.splitlines()


class Sinfo:
    """sinfo's answers for one launch: each distinct query (its fields) runs once, however often the plan, the
    launcher's check and the submission ask it; a failure is kept too and raised again, so that a controller
    that does not answer costs one wait. One per `LaunchPlan` (a fresh one where none is given): a later launch,
    in a long-lived process too, asks the cluster again."""

    def __init__(self) -> None:
        self._answers: dict[str, list[str] | ZebraError] = {}

    @property
    def asked(self) -> list[str]:
        """The queries run, in order."""
        return list(self._answers)

    def lines(self, fields: str) -> list[str]:
        """The lines of `sinfo --all -h -o FIELDS` (`_sinfo`), run on the first ask only."""
        if fields not in self._answers:
            try:
                self._answers[fields] = _sinfo(fields)
            except ZebraError as e:
                self._answers[fields] = e
        answer = self._answers[fields]
        if isinstance(answer, ZebraError):
            raise ZebraError(answer.message, fix=answer.fix) from None
        return list(answer)


def partitions(sinfo: Sinfo | None = None) -> list[tuple[str, str]]:
    """sinfo's partitions as (name, time limit), the default one's name ending in `*`."""
    rows = [line.split() for line in (sinfo or Sinfo()).lines("%P %l")]
    return [(row[0], row[1]) for row in rows if len(row) == 2]


def partition_gpus(partition: str | None, sinfo: Sinfo | None = None) -> dict[int, int]:
    """{GPUs per node: nodes} of `partition` (None: the default one), from the nodes' generic resources as
    sinfo shows them (`gpu:8`, `gpu:mi300x:8(S:0-1)`, `(null)`: none)."""
    counts: dict[int, int] = {}
    for row in (line.split(None, 2) for line in (sinfo or Sinfo()).lines("%P %D %G")):
        if len(row) != 3 or not row[1].isdigit():
            continue
        name, nodes, gres = row
        if (partition and name.rstrip("*") == partition) or (not partition and name.endswith("*")):
            gpus = sum(int(n) for n in re.findall(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", gres))
            counts[gpus] = counts.get(gpus, 0) + int(nodes)
    return counts


def check_partition(
    partition: str | None, rows: list[tuple[str, str]] | None = None, sinfo: Sinfo | None = None
) -> None:
    """A one-line ZebraError naming `--partition` unless the cluster has that partition (`rows`: sinfo's
    `partitions()`, asked here through `sinfo` when not given); a controller that does not answer is one too."""
    if not partition:
        return
    names = [name.rstrip("*") for name, _ in (partitions(sinfo) if rows is None else rows)]
    if partition not in names:
        raise ZebraError(
            f"--partition {partition}: no such partition on this cluster (sinfo lists {', '.join(names) or 'none'})",
            fix=f"pick one of: {', '.join(names)}" if names else SLURM_FIX,
        )


def check_partition_if_here(partition: str | None, sinfo: Sinfo | None = None) -> None:
    """`check_partition` where a Slurm client answers here; a plan may be made for a cluster elsewhere (a
    `--dry-run` on a laptop), where nothing can be checked (`check_launcher` requires the client)."""
    if not partition or not shutil.which("sinfo"):
        return
    try:
        rows = partitions(sinfo)
    except ZebraError:  # sinfo here, no controller answering: the launcher's own check says so
        return
    check_partition(partition, rows)


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
        """Each task's log as sbatch names it: %j the job id, %t the task."""
        return str(Path(self.folder) / LOG_NAME.format(job="%j", task="%t"))

    def logs(self, job_id: str) -> list[str]:
        """The log of each task of job `job_id`, task 0's first."""
        tasks = self.nodes * self.ntasks_per_node
        return [str(Path(self.folder) / LOG_NAME.format(job=job_id, task=t)) for t in range(tasks)]

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


def slurm_spec(run: TrainRun) -> SlurmSpec:
    """The sbatch parameters of `run`: one task per rank (one per GPU), or one per node with a container."""
    spec, ranks = run.recipe.launch, run.ranks
    if spec.time:
        try:
            parse_time(spec.time)
        except ValueError:
            raise ZebraError(
                f"--time {spec.time!r}: not a Slurm time", fix="use MM, HH:MM:SS or D-HH:MM:SS, e.g. 24:00:00"
            ) from None
    tasks = 1 if spec.container else ranks.ranks_per_node
    cpus = spec.cpus_per_task or (None if ranks.device == "cuda" else 1)
    if spec.container and ranks.device == "cpu" and not spec.cpus_per_task:
        cpus = ranks.ranks_per_node
    run_dir = run.run_dir.resolve()
    return SlurmSpec(
        job_name=f"zebra-{run_dir.name}",
        nodes=ranks.nodes,
        ntasks_per_node=tasks,
        gpus_per_node=ranks.gpus_per_node or None,
        cpus_per_task=cpus,
        partition=spec.partition or None,
        account=spec.account or None,
        qos=spec.qos or None,
        time=spec.time or None,
        extra=parse_sbatch_extra(spec.sbatch_extra),
        folder=str(run_dir / "slurm"),
        container=spec.container,
    )
