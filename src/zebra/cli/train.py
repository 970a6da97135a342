"""`zebra train` and `zebra plot`: start, resume and inspect training runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from zebra.cli import _launch as L
from zebra.cli._options import JsonOpt, SetOpt, YesOpt, examples
from zebra.cli._output import out
from zebra.cli._prompt import choose, confirm
from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    from zebra.launch import LaunchPlan
    from zebra.train.run import TrainRun

TRAIN_EXAMPLES = examples(
    "zebra train tiny",
    "zebra train tiny-gdn --max-steps 50 --run gdn-try",
    "zebra train 1b-gdn-pure --gpus 8 --data /data/fineweb_text_document",
    "zebra train 1b-gdn-pure --data a_text_document:0.7 --data b_text_document:0.3 --set train.lr=3e-4",
    "zebra train 1b-gdn-pure --mock-data --max-steps 20 --dry-run",
    "zebra train tiny --nproc 2              # two CPU ranks (gloo)",
    "zebra train tiny --resume never --yes   # start the run over",
    "zebra train tiny --init smol-gdn --teacher smollm2.gguf --data docs/prefix --set data.tokenizer=smol-gdn",
    "zebra train 1b-gdn-pure --launcher docker --gpus 8 --data /data/fineweb_text_document",
    "zebra train 1b-gdn-pure --launcher slurm --nodes 2 --gpus 8 --partition mi300x --time 24:00:00 --follow",
)


def train(
    recipe: Annotated[
        str | None,
        typer.Argument(help="Recipe name (`zebra recipes list`) or YAML path.", show_default=False),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", min=1, help="GPU ranks per node (default: the recipe's, 0 = all visible)."),
    ] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", min=1, help="Nodes (with --rdzv-endpoint).")] = None,
    nproc: Annotated[
        int | None, typer.Option("--nproc", min=1, help="CPU ranks on this machine (gloo), instead of GPUs.")
    ] = None,
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data",
            help="Megatron prefix, prep folder or @sample, optionally :weight (repeat to blend).",
            metavar="PREFIX[:W]",
        ),
    ] = None,
    mock_data: Annotated[bool, typer.Option("--mock-data", help="Train on megatron's mock dataset.")] = False,
    teacher: Annotated[
        str | None,
        typer.Option(
            "--teacher",
            help="Distil from this model: HF folder or hub id, .gguf or Megatron checkpoint (distill.teacher).",
        ),
    ] = None,
    init: Annotated[
        Path | None,
        typer.Option(
            "--init", help="Start from this export's weights and shapes (e.g. zebra upcycle's output)."
        ),
    ] = None,
    set_: SetOpt = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Override train.max_steps.")
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder holding run directories.")] = Path(
        "runs"
    ),
    run: Annotated[str | None, typer.Option("--run", help="Run name (default: the recipe's name).")] = None,
    resume: Annotated[
        str,
        typer.Option(
            "--resume", help="auto (continue the run's newest checkpoint), never, or a checkpoint PATH."
        ),
    ] = "auto",
    rdzv_endpoint: Annotated[
        str | None, typer.Option("--rdzv-endpoint", help="HOST:PORT every node meets at (multi-node).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the resolved plan and exit.")] = False,
    json_: JsonOpt = False,
    yes: YesOpt = False,
    launcher: L.LauncherOpt = None,
    image: L.ImageOpt = None,
    mount: L.MountOpt = None,
    env: L.EnvOpt = None,
    secret_env: L.SecretEnvOpt = None,
    partition: L.PartitionOpt = None,
    account: L.AccountOpt = None,
    qos: L.QosOpt = None,
    time_limit: L.TimeOpt = None,
    sbatch_extra: L.SbatchExtraOpt = None,
    container: L.ContainerOpt = False,
    follow: L.FollowOpt = False,
) -> None:
    """Train a recipe: checkpoints, metrics.jsonl, a loss curve and an HF export land in OUTPUT/RUN."""
    # the library loads here, not when the CLI starts (zebra --help stays fast)
    from zebra.launch import hold_run_dir, launch_overrides, make_plan, start, with_launch_lists
    from zebra.recipes import list_recipes, load_recipe
    from zebra.recipes.loader import combine, parse_assignments
    from zebra.train.run import data_overrides, distill_overrides, prepare_run

    name = recipe or choose("Which recipe?", list_recipes(), yes=yes, flag="RECIPE")
    sets = combine(  # typed values; --set text read here, once
        distill_overrides(teacher, str(init) if init else None),  # first: --set may change what --init set
        parse_assignments(set_ or []),
        launch_overrides(
            launcher=launcher.value if launcher else None,
            image=image,
            partition=partition,
            account=account,
            qos=qos,
            time=time_limit,
            container=container or None,
        ),
        data_overrides(data, mock_data, max_steps),
    )
    lists = {
        "mounts": mount or [],
        "sbatch_extra": sbatch_extra or [],
        "env": env or [],
        "secret_env": secret_env or [],
    }
    plan = make_plan(
        with_launch_lists(load_recipe(name, overrides=sets), **lists),
        gpus=gpus,
        nproc=nproc,
        nodes=nodes,
        rdzv_endpoint=rdzv_endpoint,
        output=output,
        run=run,
        resume=resume,
        prepare_data=not dry_run,  # a dry run writes nothing, not even the tokenized @sample
    )
    if dry_run:
        _show_plan(plan, json_)
        return
    L.check(plan)
    with hold_run_dir(plan) as lock:  # a run in progress is told as one, not as an earlier run's results
        start_over = _confirm_start(plan.run, yes)
        prepare_run(plan.run, start_over=start_over)
        outcome = start(plan, L.callbacks(), follow=follow, lock=lock)
    if not outcome.ended:  # a Slurm job runs on
        if follow:
            L.stopped_following(outcome.job)
        return
    _show_result(plan.run, outcome.stopped_by, json_)


def _confirm_start(run: TrainRun, yes: bool) -> bool:
    """Warn about recipe keys that change on resume; ask before `--resume PATH` replaces an earlier run's
    outputs; whether to delete an earlier run first (`--resume never`, or results without a checkpoint to resume:
    starting would replace them); each asked unless --yes, refused off a terminal without it."""
    from zebra.folders.checkpoint_dir import committed
    from zebra.train.run import has_outputs, replaces_outputs, results_without_checkpoint

    if run.changed:
        out.warn(f"{run.run_dir}/config.yaml changes on resume: {', '.join(run.changed[:8])}")
    if replaces_outputs(run) and not confirm(
        f"{run.run_dir} holds an earlier run: continue it from {run.resume}, replacing its later metrics "
        "and checkpoints?",
        yes=yes,
    ):
        raise ZebraError(
            f"{run.run_dir}: holds an earlier run, whose later metrics and checkpoints --resume {run.resume} "
            "would replace",
            fix="pass --yes to continue it from there, or --run NAME for a new run",
        )
    orphans = results_without_checkpoint(run)
    unreadable = [p.name for p in committed(run.run_dir / "checkpoints")] if orphans else []
    if unreadable and not yes:  # checkpoints there, but no meta.json that reads: told as such, never guessed
        raise ZebraError(
            f"{run.run_dir}: no checkpoint to resume: the meta.json of {', '.join(unreadable[:3])} cannot be read",
            fix="restore those meta.json files, or pass --run NAME for a new run (--yes deletes them and starts over)",
        )
    if orphans and not confirm(
        f"{run.run_dir} holds an earlier run's {', '.join(orphans)} but no checkpoint to resume: delete them "
        "and start over?",
        yes=yes,
    ):
        raise ZebraError(
            f"{run.run_dir}: holds an earlier run's {', '.join(orphans)} but no checkpoint to resume from",
            fix="pass --run NAME for a new run, or --yes to delete them and start over",
        )
    start_over = bool(orphans) or (run.resume == "never" and has_outputs(run.run_dir))
    if (
        run.resume == "never"
        and start_over
        and not confirm(f"{run.run_dir} holds an earlier run: delete it and start over?", yes=yes)
    ):
        raise ZebraError(
            f"{run.run_dir}: holds an earlier run",
            fix="pass --yes to start over, or --run NAME for a new run",
        )
    return start_over


def _show_plan(plan: LaunchPlan, json_: bool) -> None:
    info = plan.run.summary()
    if json_:
        out.json({**info, "launch": plan.describe()})
        return
    data = info["data"]
    checkpoint = info["checkpoint_step"]
    rows = [
        ["recipe", f"{info['recipe']} ({info['source']})"],
        ["run directory", info["run_dir"]],
        ["ranks", plan.run.ranks.describe()],
        [
            "batch",
            f"{info['micro_batch']} micro x {info['world_size']} rank(s) x {info['accumulation']} accumulation = "
            f"{info['global_batch']} sequences x {info['seq_len']} tokens",
        ],
        ["steps", f"{info['max_steps']:,} ({info['tokens_per_step'] * info['max_steps']:,} tokens)"],
        ["data", data if isinstance(data, str) else "\n".join(data)],
        ["tokenizer", info["tokenizer"]],
        *([["teacher", info["teacher"]]] if info["teacher"] else []),
        *([["init", info["init"]]] if info["init"] else []),
        [
            "resume",
            info["resume"] + (f" (checkpoint at step {checkpoint})" if checkpoint is not None else ""),
        ],
    ]
    out.table(["", "plan"], rows, title="zebra train --dry-run")
    L.show_launch_plan(plan)


def _show_result(run: TrainRun, stopped_by: str | None, json_: bool) -> None:
    from zebra.train.summary import summarize_run

    summary = summarize_run(run.run_dir)
    summary["stopped_by"] = stopped_by
    if json_:
        out.json(summary)
        return

    def at(step: int) -> str:  # the step a figure was logged at, when it is not the run's last
        return "" if step == summary["step"] else f" at step {step}"

    loss = (
        f"loss {summary['loss']:.4f}{at(summary['loss_step'])}"
        if summary["loss"] is not None
        else "no loss logged"
    )
    if summary["val_loss"] is not None:
        loss += f", validation {summary['val_loss']:.4f}{at(summary['val_step'])}"
    if stopped_by:
        out.result(
            f"stopped by {stopped_by} at step {summary['step']} ({loss}); checkpoint {summary['checkpoint']}"
        )
        out.hint(f"continue with the same command and --resume auto (run {run.run_dir})")
        return
    out.result(f"trained {run.recipe.name} for {summary['step']} steps: {loss}")
    if summary["export"]:
        out.result(f"HF export: {summary['export']}")
    out.result(f"metrics: {run.run_dir / 'metrics.jsonl'}, loss curve: {run.run_dir / 'loss.png'}")


PLOT_EXAMPLES = examples(
    "zebra plot runs/tiny", "zebra plot runs/tiny-gdn runs/tiny-kda -o compare.png --log"
)


def plot(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (each with metrics.jsonl).")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="PNG to write (default: RUN/loss.png, or ./loss.png)."),
    ] = None,
    log: Annotated[bool, typer.Option("--log", help="Logarithmic loss axis.")] = False,
) -> None:
    """Draw (or compare) the loss curves of training runs."""
    from zebra.train.plot import plot_runs

    target = output or (runs[0] / "loss.png" if len(runs) == 1 else Path("loss.png"))
    out.result(f"wrote {plot_runs(runs, target, log_y=log)}")
