"""`zebra jobs list|logs|cancel`: the Slurm jobs `zebra train --launcher slurm` submitted."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from zebra.cli._launch import follow_job
from zebra.cli._options import JsonOpt, examples
from zebra.cli._output import out
from zebra.core.errors import ZebraError

app = typer.Typer(
    help="The Slurm jobs zebra submitted: list them, read their logs, cancel them.",
    no_args_is_help=True,
    epilog=examples(
        "zebra jobs list",
        "zebra jobs logs --follow",
        "zebra jobs logs 1234 --task 1",
        "zebra jobs cancel 1234",
    ),
)

JobIdArg = Annotated[str | None, typer.Argument(help="Job id (default: the newest).", show_default=False)]


@app.command("list")
def list_jobs(json_: JsonOpt = False) -> None:
    """Every job zebra submitted, with its state (from squeue, the tasks' exit codes or scontrol)."""
    from zebra.launch.jobs import job_status, load_jobs, registry_path

    rows = []
    for job in load_jobs():
        status = job_status(job)
        rows.append({
            "id": job.id, "state": status.state, "exit_code": status.exit_code, "recipe": job.recipe,
            "ranks": f"{job.nodes}x{job.ranks // max(job.nodes, 1)}", "submitted": job.submitted,
            "run_dir": job.run_dir, "log": job.logs[0],
        })  # fmt: skip
    if json_:
        out.json(rows)
        return
    if not rows:
        out.text(f"no jobs yet ({registry_path()} is empty)")
        return
    columns = ["id", "state", "exit_code", "recipe", "ranks", "submitted", "run_dir"]
    out.table(columns, [[r[c] for c in columns] for r in rows], title="jobs started by zebra")


@app.command("logs")
def logs(
    job_id: JobIdArg = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends.")
    ] = False,
    task: Annotated[int, typer.Option("--task", min=0, help="Which task's log (0 = rank 0).")] = 0,
) -> None:
    """Print a job's log (task 0 unless --task), or stream it with --follow."""
    from zebra.launch.jobs import check_finished, find_job

    job = find_job(job_id)
    if task >= len(job.logs):
        raise ZebraError(
            f"--task {task}: job {job.id} has {len(job.logs)} task(s)", fix=f"pass 0..{len(job.logs) - 1}"
        )
    if follow:
        check_finished(job, follow_job(job, task))
        out.result(f"job {job.id} completed")
        return
    try:
        with open(job.logs[task], "rb") as f:
            sys.stdout.buffer.write(f.read())
    except FileNotFoundError:
        raise ZebraError(
            f"{job.logs[task]}: no log yet (the job has not started)", fix="zebra jobs list shows its state"
        ) from None


@app.command("cancel")
def cancel(job_id: Annotated[str, typer.Argument(help="Job id.")]) -> None:
    """Cancel a job: its ranks get SIGTERM and save a checkpoint first; `zebra train ... --resume auto` continues."""
    from zebra.launch.jobs import cancel as cancel_job
    from zebra.launch.jobs import find_job

    job = find_job(job_id)
    ended = cancel_job(job)
    if ended is not None:  # nothing to cancel: exit 0, as the job is not running either way
        out.text(f"job {job.id} already ended ({ended.state}): nothing cancelled (run {job.run_dir})")
        return
    out.result(f"cancelled job {job.id} (run {job.run_dir})")
