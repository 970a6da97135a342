"""A run directory at a glance: its last step, losses, newest checkpoint and export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zebra.folders.checkpoint_dir import committed, newest_step
from zebra.train.metrics import read_metrics


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """`step` (the run's last: its newest checkpoint's, or its last logged step when that is later), `loss` and
    `val_loss` (last logged) with the steps they were logged at (`loss_step`, `val_step`: a run stopped by a
    signal saves steps after its last log line), `tokens_per_s` (mean of logged intervals after the first),
    `checkpoint` (newest committed) and `export` (None until written)."""
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if "val_loss" in r]
    ckpts = committed(run_dir / "checkpoints")
    rates = [r["tokens_per_s"] for r in train[1:]] or [r["tokens_per_s"] for r in train]
    export = run_dir / "export"
    loss_step = train[-1]["step"] if train else 0
    return {
        "run_dir": str(run_dir),
        "step": max(loss_step, newest_step(ckpts) or 0),
        "loss": train[-1]["loss"] if train else None,
        "loss_step": loss_step,
        "first_loss": train[0]["loss"] if train else None,
        "val_loss": valid[-1]["val_loss"] if valid else None,
        "val_step": valid[-1]["step"] if valid else None,
        "tokens_per_s": sum(rates) / len(rates) if rates else None,
        "checkpoint": str(ckpts[0]) if ckpts else None,
        "export": str(export) if (export / "config.json").is_file() else None,
    }
