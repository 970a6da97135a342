"""Option types shared by several commands (HF `_cli_utils` style)."""

from __future__ import annotations

from typing import Annotated

import typer

YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Never prompt: take defaults, confirm downloads and overwrites.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override a recipe field, e.g. --set train.lr=3e-4 (repeatable).",
        metavar="KEY=VALUE",
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing output.")]


def examples(*lines: str) -> str:
    """An epilog listing example invocations."""
    return "Examples:\n\n" + "\n\n".join(f"  $ {line}" for line in lines)
