"""The launcher options of `zebra train` and how their plans and results are shown (the logic is in
`zebra.launch`)."""

from __future__ import annotations

import shlex
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.progress import Progress

from zebra.cli._output import out

if TYPE_CHECKING:
    from zebra.launch import Callbacks, LaunchPlan
    from zebra.launch.jobs import JobRecord, JobStatus

PANEL = "Launcher (docker, slurm)"


class Launcher(StrEnum):
    local = "local"
    docker = "docker"
    slurm = "slurm"


LauncherOpt = Annotated[
    Launcher | None,
    typer.Option(
        "--launcher",
        help="Where the ranks run (default: the recipe's launch.launcher).",
        rich_help_panel=PANEL,
    ),
]
ImageOpt = Annotated[
    str | None,
    typer.Option(
        "--image", help="Container image (default: the recipe's launch.image).", rich_help_panel=PANEL
    ),
]
MountOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--mount",
        metavar="HOST[:CTR][:ro]",
        help="Extra container mount (repeatable).",
        rich_help_panel=PANEL,
    ),
]
EnvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        metavar="NAME",
        help="Pass this environment variable to the ranks (repeatable).",
        rich_help_panel=PANEL,
    ),
]
PartitionOpt = Annotated[
    str | None, typer.Option("--partition", help="Slurm partition.", rich_help_panel=PANEL)
]
AccountOpt = Annotated[str | None, typer.Option("--account", help="Slurm account.", rich_help_panel=PANEL)]
QosOpt = Annotated[str | None, typer.Option("--qos", help="Slurm QoS.", rich_help_panel=PANEL)]
TimeOpt = Annotated[
    str | None,
    typer.Option(
        "--time", help="Slurm time limit, e.g. 24:00:00 (default: the partition's).", rich_help_panel=PANEL
    ),
]
SecretEnvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--secret-env",
        metavar="NAME",
        help="Pass this variable to the ranks as a secret: never shown, logged or written (repeatable).",
        rich_help_panel=PANEL,
    ),
]
SbatchExtraOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sbatch-extra",
        metavar="--FLAG[=V]",
        help="Extra sbatch flag, e.g. --sbatch-extra=--exclusive (repeatable).",
        rich_help_panel=PANEL,
    ),
]
ContainerOpt = Annotated[
    bool,
    typer.Option(
        "--container", help="Slurm: run each node's ranks in the container image.", rich_help_panel=PANEL
    ),
]
FollowOpt = Annotated[
    bool, typer.Option("--follow", help="Slurm: stream the job's log until it ends.", rich_help_panel=PANEL)
]


def show_launch_plan(plan: LaunchPlan) -> None:
    """The launch plan as tables: command, environment (secrets masked), container, sbatch (the ranks are in
    the run's table)."""
    info = plan.describe()
    rows = [
        ["launcher", info["launcher"]],
        ["command" if plan.slurm is None or plan.container else "each task runs", info["command"]],
    ]
    if info.get("torchrun"):
        rows.append(["torchrun", shlex.join(info["torchrun"])])
    if info.get("rdzv_endpoint"):
        rows.append(["rendezvous", info["rdzv_endpoint"]])
    env = info["env"]
    rows.append(
        ["environment", "\n".join(f"{k}={v}" for k, v in env.items()) or "(none of the allow-list is set)"]
    )
    out.table(["", "launch"], rows, title=f"{info['launcher']} launcher")
    if "container" in info:
        c = info["container"]
        crow = [[key, _cell(c[key])] for key in c if key not in ("env", "command")]
        crow.append(["env", "\n".join(f"{k}={v}" for k, v in c["env"].items())])
        crow.append(["command", c["command"]])
        out.table(["", "container"], crow, title="container spec")
    if "slurm" in info:
        s = info["slurm"]
        out.table(
            ["flag", "value"],
            [[f"--{k}", _cell(v)] for k, v in s["sbatch"].items()],
            title="sbatch parameters",
        )
        out.text(
            f"{s['tasks']} task(s), each runs {s['task_runs']}; logs {s['logs']}; requeue: {s['requeue']}"
        )


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value) or "-"
    if value is True:
        return "(set)"
    return "-" if value is None else str(value)


def show_job(job: JobRecord) -> None:
    out.result(f"submitted Slurm job {job.id}: {job.nodes} node(s), {job.ranks} rank(s)")
    out.text(
        f"  log       {job.logs[0]}" + (f"  (+{len(job.logs) - 1} more tasks)" if len(job.logs) > 1 else "")
    )
    out.text(f"  run       {job.run_dir}")
    out.hint(f"zebra jobs logs {job.id} --follow   |   zebra jobs cancel {job.id}")


def show_job_state(job: JobRecord, status: JobStatus) -> None:
    """A followed job's new state (not its end: the command's result says that)."""
    if not status.finished:
        reason = f" ({status.reason})" if status.reason not in ("", "None") else ""
        out.stderr.print(f"[dim]job {job.id}: {status.state}{reason}[/]")


def stopped_following(job: JobRecord) -> NoReturn:
    """Ctrl-C stopped following `job`; it runs on."""
    out.hint(
        f"stopped following; the job runs on: zebra jobs logs {job.id} --follow, zebra jobs cancel {job.id}"
    )
    raise typer.Exit(130)


def follow_job(job: JobRecord, task: int = 0) -> JobStatus:
    """Stream a job's log here until it ends; Ctrl-C stops following, not the job."""
    from zebra.launch.jobs import follow_log

    status = follow_log(job, sys.stdout.buffer, task=task, on_state=lambda state: show_job_state(job, state))
    if status is None:
        stopped_following(job)
    return status


def callbacks() -> Callbacks:
    """How `zebra.launch.start` reports here: launcher lines, the ranks' output, a training run's progress,
    a submitted job and its states."""
    from zebra.launch import Callbacks

    return Callbacks(
        log=out.text,
        output=sys.stdout.buffer,
        training=out.train_view(),
        submitted=show_job,
        job_state=show_job_state,
    )


def check(plan: LaunchPlan) -> None:
    """The launcher's service is there, before anything is written; an image pull shows a progress bar."""
    from zebra.launch import check_launcher

    bars: list[Progress] = []

    def progress(done: float, total: float) -> None:
        if not bars:
            bars.append(out.progress(f"pulling {plan.image}", total=None, unit="MB"))
            bars[0].start()
        bars[0].update(bars[0].task_ids[0], completed=done, total=total)

    try:
        check_launcher(plan, log=out.text, progress=progress)
    finally:
        for bar in bars:
            bar.stop()
