"""`zebra --help`: the root's help drawn with three Rich pieces instead of Typer's whole help renderer.

Typer's renderer (`typer.rich_utils`) imports Rich's markdown, syntax and traceback support (markdown-it,
pygments, attrs) and lays out every option with its type and default: about half of what `zebra --help` cost
(docs/benchmarks.md). The root has only flags and a list of commands, so it is drawn here in the same layout and
styles (usage, description, an Options and a Commands panel); every subcommand's help stays Typer's.
"""

from __future__ import annotations

import inspect
from typing import Any

from zebra.cli._output import out


def print_group_help(group: Any, ctx: Any) -> None:
    """Print GROUP's help (usage, description, options, commands, epilog) on `out`'s console, as Typer lays it
    out."""
    from rich.padding import Padding
    from rich.text import Text

    console = out.console
    usage = f"{ctx.command_path} {' '.join(group.collect_usage_pieces(ctx))}"
    console.print(Padding(Text.assemble(("Usage: ", "yellow"), (usage, "bold")), 1))
    description = inspect.cleandoc(group.help or "").partition("\f")[0].split("\n\n")[0]
    if description:
        console.print(Padding(Text.from_markup(description.replace("\n", " ")), (0, 1, 1, 1)))
    options = []
    for param in group.get_params(ctx):
        if param.param_type_name == "option" and not param.hidden:
            long = [o for o in param.opts if o.startswith("--")]
            short = [o for o in param.opts if not o.startswith("--")]
            options.append(
                (Text(",".join(long), "bold cyan"), Text(",".join(short), "bold green"), param.help)
            )
    console.print(_panel("Options", options))
    commands = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is not None and not command.hidden:
            summary = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
            commands.append((Text(name, "bold cyan"), summary.replace("\n", " ")))
    if commands:
        console.print(_panel("Commands", commands))
    if group.epilog:
        console.print(Padding(Text.from_markup(inspect.cleandoc(group.epilog)), 1))


def _panel(title: str, rows: list[tuple]):
    """A dim rounded panel around a borderless table: the first columns as wide as their text, the last wrapped."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table(highlight=False, show_header=False, expand=True, box=None, padding=(0, 1), pad_edge=False)
    for _ in rows[0][:-1]:
        table.add_column(no_wrap=True)
    table.add_column(ratio=10)
    for *names, text in rows:
        table.add_row(*names, Text.from_markup(text or ""))
    return Panel(table, border_style="dim", title=title, title_align="left")
