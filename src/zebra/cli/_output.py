"""The one place Rich is used: tables, results, warnings, errors and JSON for every command."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table


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
            table.add_column(col, justify=justify.get(col, "left"))  # type: ignore[arg-type]
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

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        sys.stdout.flush()


out = Output()
