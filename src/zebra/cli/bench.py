"""`zebra bench`: measure zebra itself (startup today; data, train and decode throughput join here)."""

from __future__ import annotations

from typing import Annotated

import typer

from zebra.cli._options import JsonOpt, examples
from zebra.cli._output import out

app = typer.Typer(help="Measure startup, data, training and decoding speed.", no_args_is_help=True)


@app.command(epilog=examples("zebra bench startup", "zebra bench startup --repeats 20 --json"))
def startup(
    repeats: Annotated[int, typer.Option("--repeats", "-n", min=1, help="Fresh processes per command.")] = 10,
    json_: JsonOpt = False,
) -> None:
    """Wall time of `zebra --help`, `--version` and `recipes list` in fresh processes, and heavy imports."""
    from zebra.bench.startup import DEFAULT_COMMANDS, measure_startup

    with out.progress("startup", total=(len(DEFAULT_COMMANDS) + 1) * repeats, unit="run") as bar:
        results = measure_startup(repeats=repeats, on_run=lambda: bar.advance(bar.task_ids[0]))
    if json_:
        out.json([r.to_dict() for r in results])
        return
    rows = []
    for r in results:
        heavy = "n/a" if r.heavy is None else (", ".join(r.heavy) or "none")
        rows.append(
            [r.command, f"{r.median * 1000:.0f} ms", f"{r.best * 1000:.0f} ms", len(r.seconds), heavy]
        )
    out.table(
        ["command", "median", "min", "runs", "heavy imports"],
        rows,
        title="zebra startup (fresh processes)",
        justify={"median": "right", "min": "right", "runs": "right"},
    )
    for r in results:
        if r.heavy:
            out.warn(
                f"`{r.command}` imports {', '.join(r.heavy)}: import them inside the command that needs them"
            )
