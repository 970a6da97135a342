"""Rank 0's console view of a run: a live progress bar with the latest figures on a terminal, one plain line
per log step otherwise (logs, Slurm output files, pipes)."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def format_record(r: dict[str, Any]) -> str:
    """`loss 2.3456 | lr 3.00e-03 | 12.3k tok/s | MFU 41.2% | mem 1.2 GB` from a metrics record."""
    parts = [f"loss {r['loss']:.4f}", f"lr {r['lr']:.2e}", f"{r['tokens_per_s'] / 1e3:.1f}k tok/s"]
    if r.get("mfu") is not None:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    parts.append(f"mem {r['memory_gb']:.1f} GB")
    if r.get("skipped_steps"):
        parts.append(f"skipped {r['skipped_steps']}")
    return " | ".join(parts)


class TrainView:
    """Progress of one run on rank 0 (a silent object on other ranks)."""

    def __init__(self, *, total_steps: int, start_step: int, enabled: bool):
        from zebra.cli._output import out

        self.console = out.console
        self.enabled = enabled
        self.total, self.start = total_steps, start_step
        self.live = enabled and self.console.is_terminal
        self._last = (start_step, time.perf_counter())  # (step, time) of the previous log line
        self._rate: float | None = None  # seconds per step, smoothed
        self._progress: Progress | None = None
        self._task = None

    def restart_at(self, step: int) -> None:
        """The run resumes at `step` (the bar and the ETA start there)."""
        self.start, self._last = step, (step, time.perf_counter())

    def __enter__(self) -> TrainView:
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("ETA {task.fields[eta]}"),
                TextColumn("{task.fields[stats]}"),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total, completed=self.start, eta="-", stats="starting"
            )
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def eta(self, step: int) -> float:
        """Seconds left, from a moving average of the recent seconds per step (start-up and slow spells fade)."""
        now = time.perf_counter()
        last_step, last_t = self._last
        if step > last_step:
            rate = (now - last_t) / (step - last_step)
            self._rate = rate if self._rate is None else 0.7 * self._rate + 0.3 * rate
            self._last = (step, now)
        return (self._rate or 0.0) * (self.total - step)

    def log(self, record: dict[str, Any]) -> None:
        """Show a training record (`step`, `loss`, `lr`, `tokens_per_s`, `mfu`, `memory_gb`)."""
        if not self.enabled:
            return
        step, eta = record["step"], format_duration(self.eta(record["step"]))
        if self._progress is not None:
            self._progress.update(self._task, completed=step, eta=eta, stats=format_record(record))
        else:
            self.console.print(
                f"step {step}/{self.total} | {format_record(record)} | ETA {eta}", soft_wrap=True
            )

    def note(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, soft_wrap=True)

    def warn(self, message: str) -> None:
        """A warning on stderr (rank 0 only: every rank sees the same checkpoints and losses)."""
        from zebra.cli._output import out

        if self.enabled:
            out.warn(message)
