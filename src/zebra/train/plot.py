"""Loss curves from runs' metrics.jsonl: training loss per logged step and validation loss points; a distillation
run draws its student's CE against its teacher's CE on the same tokens (and the KL) instead of the loss, and the
teacher's validation loss as a horizontal line."""

from __future__ import annotations

from pathlib import Path

from zebra.core.atomic import check_output_apart, save_figure
from zebra.core.errors import ZebraError
from zebra.train.metrics import read_metrics


def plot_runs(run_dirs: list[Path], output: Path, *, log_y: bool = False) -> Path:
    """Draw the loss curves of `run_dirs` (one colour per run) into the PNG `output`, written atomically.

    Raises:
        ZebraError: a run has no metrics.jsonl or no logged loss; `output` is a file a run is read from.
    """
    check_output_apart(output, [("the run file", run / "metrics.jsonl") for run in run_dirs])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for i, run in enumerate(run_dirs):
        records = read_metrics(run / "metrics.jsonl")
        train = [(r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), int | float)]
        if not train:
            raise ZebraError(
                f"{run}: no training loss logged (metrics.jsonl missing or empty)",
                fix="pass run directories written by `zebra train`",
            )
        valid = [(r["step"], r["val_loss"]) for r in records if isinstance(r.get("val_loss"), int | float)]
        color = f"C{i % 10}"
        name = f"{run.name} " if len(run_dirs) > 1 else ""
        if any("teacher_ce" in r for r in records):
            _plot_distillation(ax, records, name, color)
        else:
            ax.plot(*zip(*train, strict=True), color=color, label=name or "train", linewidth=1.4)
        if valid:
            vlabel = f"{run.name} valid" if len(run_dirs) > 1 else "valid"
            ax.plot(*zip(*valid, strict=True), "o--", color=color, label=vlabel, markersize=4, alpha=0.8)
        teacher = [
            r["teacher_val_loss"] for r in records if isinstance(r.get("teacher_val_loss"), int | float)
        ]
        if teacher:  # a distillation run: the teacher's CE on the same validation batches
            ax.axhline(teacher[-1], color=color, linestyle="-.", linewidth=1.0, label=f"{name}teacher valid")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(run_dirs[0].name if len(run_dirs) == 1 else "loss")
    fig.tight_layout()
    try:
        return save_figure(fig, output)
    finally:
        plt.close(fig)


def _plot_distillation(ax, records: list[dict], name: str, color: str) -> None:
    """The student's CE (solid), the teacher's CE on the same tokens (dashed) and the KL (dotted)."""
    styles = (("ce", "student CE", "-"), ("teacher_ce", "teacher CE", "--"), ("kl", "KL", ":"))
    for key, label, style in styles:
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
        if points:
            ax.plot(*zip(*points, strict=True), style, color=color, label=name + label, linewidth=1.4)


def plot_pipeline(runs: list[tuple[str, Path]], tokens_per_step: int, output: Path) -> Path:
    """`zebra distill`'s loss.png: each training stage's held-out CE (its validation loss) against the pipeline's
    tokens (the stages one after another), and the teacher's held-out CE as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    offset, teacher = 0, None
    for i, (name, run) in enumerate(runs):
        records = read_metrics(run / "metrics.jsonl")
        points = [(offset + r["step"] * tokens_per_step, r["val_loss"]) for r in records if "val_loss" in r]
        if points:
            ax.plot(*zip(*points, strict=True), "o-", color=f"C{i % 10}", label=name, markersize=4)
        teacher = next((r["teacher_val_loss"] for r in records if "teacher_val_loss" in r), teacher)
        offset += max((r["step"] for r in records if "step" in r), default=0) * tokens_per_step
    if teacher is not None:
        ax.axhline(teacher, color="black", linestyle=":", label=f"teacher {teacher:.3f}")
    ax.set_xlabel("training tokens, all stages")
    ax.set_ylabel("held-out CE (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        return save_figure(fig, output)
    finally:
        plt.close(fig)
