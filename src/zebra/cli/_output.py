"""The one place Rich is used: tables, results, warnings, errors and JSON for every command."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
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

    def progress(self, description: str, total: float | None, unit: str = "it") -> Progress:
        """A transient progress bar on stderr showing count, rate and ETA.

        with out.progress("tokenizing", total=n_docs, unit="doc") as bar:
            task = bar.task_ids[0]
            bar.advance(task)
        """
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            RateColumn(unit),
            TimeRemainingColumn(),
            console=self.stderr,
            transient=True,
        )
        bar.add_task(description, total=total)
        return bar

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        sys.stdout.flush()


class RateColumn(ProgressColumn):
    """Items per second, e.g. '12.3 doc/s' (blank until measured)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.1f} {self.unit}/s", style="progress.data.speed")


@contextmanager
def progress_callback(description: str, *, unit: str | None = None) -> Iterator[Callable[..., None]]:
    """A transient bar on stderr fed by a library's progress callback: yields that callback.

    The library calls it as `callback(done, total=None, **counts)`. The bar fills with `done` of `total` (None:
    not known, no bar), the ETA follows from it, and each count shows its value and its rate since the first
    call (`tok=1234` -> `1,234 tok 617 tok/s`); with `unit`, `done` itself is shown the same way.

        with progress_callback("converting", unit="chunks") as on_progress:
            convert_fla(arrow_dir, output, on_progress=on_progress)
    """
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeRemainingColumn(),
        console=out.stderr,
        transient=True,
    )
    task = bar.add_task(description, total=None, counts="")
    first: dict[str, tuple[float, float]] = {}  # count name -> (time, value) at the first call

    def update(done: float, total: float | None = None, **counts: float) -> None:
        now = time.monotonic()
        shown = []
        for name, value in (({unit: done} if unit else {}) | counts).items():
            form = ",.0f" if isinstance(value, int) else ",.1f"
            t0, v0 = first.setdefault(name, (now, value))
            rate = f" {(value - v0) / (now - t0):{form}} {name}/s" if now > t0 else ""
            shown.append(f"{value:{form}} {name}{rate}")
        bar.update(task, completed=done, total=total, counts="  ".join(shown))

    with bar:
        yield update


out = Output()
