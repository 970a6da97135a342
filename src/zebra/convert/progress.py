"""A per-tensor Rich progress bar on stderr (bytes written, rate, ETA, current tensor), or a no-op."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def tensor_progress(specs: Sequence[Any], label: str, *, enabled: bool) -> Iterator[Callable[[Any], None]]:
    """Yield `advance(spec)`, called once per written tensor (`spec.name`, `spec.nbytes`)."""
    if not enabled:
        yield lambda spec: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[name]}", style="dim"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=sum(s.nbytes for s in specs), name="")

        def advance(spec: Any) -> None:
            bar.update(task, advance=spec.nbytes, name=spec.name)

        yield advance
