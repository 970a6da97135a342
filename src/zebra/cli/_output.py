"""The one place Rich is used: tables, results, warnings, errors and JSON for every command."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text


class Output:
    """Human output on stdout, errors and hints on stderr; `json()` for scripts."""

    def __init__(self) -> None:
        self.console = Console(highlight=False, soft_wrap=False)
        self.stderr = Console(stderr=True, highlight=False)

    def text(self, message: str = "") -> None:
        self.console.print(message)

    def table(
        self,
        columns: list[str],
        rows: list[list[Any]],
        *,
        title: str | None = None,
        justify: dict[str, str] | None = None,
    ) -> None:
        justify = justify or {}
        table = Table(title=title, header_style="bold", title_justify="left")
        for col in columns:
            table.add_column(col, justify=justify.get(col, "left"), overflow="fold")  # type: ignore[arg-type]
        for row in rows:
            table.add_row(*["" if v is None else str(v) for v in row])
        self.console.print(table)

    def result(self, message: str) -> None:
        self.console.print(f"[green]✓[/] {message}")

    def warn(self, message: str) -> None:
        self.stderr.print(f"[yellow]warning:[/] {message}")

    def error(self, message: str) -> None:
        self.stderr.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)

    def hint(self, message: str) -> None:
        self.stderr.print(f"[dim]hint:[/] {message}", soft_wrap=True)

    def progress(
        self, description: str, total: float | None = None, unit: str = "it", *, enabled: bool = True
    ) -> ProgressBar:
        """A transient progress bar on stderr: count (or bytes when `unit` is "B"), rate, ETA and a note.

        The bar is itself the library's progress callback, `bar(done, total, note)`, so a command hands it over:

            with out.progress("converting", unit="B", enabled=not json_) as bar:
                convert(..., on_progress=bar)

        `enabled=False` draws nothing (e.g. with --json). Rich's own API works too (`bar.advance(bar.task_ids[0])`).
        """
        if unit == "B":
            counts: tuple[ProgressColumn, ...] = (DownloadColumn(), TransferSpeedColumn())
        else:
            counts = (MofNCompleteColumn(), RateColumn(unit))
        bar = ProgressBar(
            TextColumn("{task.description}"),
            BarColumn(),
            *counts,
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}", style="dim"),
            console=self.stderr,
            transient=True,
            disable=not enabled,
        )
        bar.add_task(description, total=total, note="")
        return bar

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        sys.stdout.flush()


class ProgressBar(Progress):
    """A Rich `Progress` with one task that library code can drive as a plain callback."""

    def __call__(self, done: float, total: float | None = None, note: str = "") -> None:
        """The library's progress callback: `done` so far, `total` when known, and what is being done now."""
        self.update(self.task_ids[0], completed=done, total=total, note=note)


class RateColumn(ProgressColumn):
    """Items per second, e.g. '12.3 doc/s' (blank until measured)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.1f} {self.unit}/s", style="progress.data.speed")


out = Output()
