"""`zebra doctor`: check this machine for everything zebra uses, with the fix for each problem."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from zebra.cli._options import JsonOpt, examples
from zebra.cli._output import out

EPILOG = examples(
    "zebra doctor",
    "zebra doctor --json",
    "zebra doctor --data-dir /scratch/data --sample 100BT",
    "zebra doctor --require docker --require slurm",
)
STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]fail[/]"}


def doctor(
    json_: JsonOpt = False,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Where data will be prepared (for the free-disk check).")
    ] = Path("."),
    sample: Annotated[
        str, typer.Option("--sample", help="FineWeb-Edu sample you plan to prepare: 10BT, 100BT or 350BT.")
    ] = "10BT",
    require: Annotated[
        list[str] | None,
        typer.Option(
            "--require",
            "-r",
            help="A check that must pass here (its warning becomes a failure), e.g. docker, slurm, gpu.",
            metavar="CHECK",
        ),
    ] = None,
) -> None:
    """Check Python, packages, GPUs, Docker, Slurm, the HF token, disk and NCCL settings; exit 1 on a failure."""
    from zebra.doctor import run_checks

    checks = run_checks(data_dir=data_dir, sample=sample, required=require or [])
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail")}
    if json_:
        out.json({"checks": [c.to_dict() for c in checks], "counts": counts, "ok": counts["fail"] == 0})
    else:
        out.table(["check", "status", "found"], [[c.name, STYLE[c.status], escape(c.detail)] for c in checks])
        fixes = [c for c in checks if c.fix and c.status != "ok"]
        if fixes:
            out.text("\nTo fix:")
        for c in fixes:
            line = f"  {STYLE[c.status]} [bold]{c.name}[/]: {escape(c.fix)}"
            out.text(line, wrap=False)  # a command to copy: the terminal folds it, Rich does not break it
        out.text(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail")
    if counts["fail"]:
        raise typer.Exit(1)
