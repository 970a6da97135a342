"""The `zebra` app: wires the command groups together and turns errors into one line each.

Nothing heavy is imported here or in the command modules at import time: torch, transformers, FLA and
megatron load inside the commands that use them, so `zebra --help` stays instant.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer
from typer.core import TyperGroup

from zebra import __version__
from zebra.cli import bench, data, doctor, jobs, recipes
from zebra.cli import chat as chat_cli
from zebra.cli import convert as convert_cli
from zebra.cli import distill as distill_cli
from zebra.cli import eval as eval_cli
from zebra.cli import generate as generate_cli
from zebra.cli import train as train_cli
from zebra.cli import upcycle as upcycle_cli
from zebra.cli._help import print_group_help
from zebra.cli._output import StdoutFailed, flush_stdout, leave_on_broken_pipe, out, stdout_reader_gone
from zebra.cli._usage import USAGE_EXIT, UsageError, is_usage_error, show_usage_error
from zebra.core.errors import ZebraError
from zebra.core.noise import quiet_library_noise


class _ZebraGroup(TyperGroup):
    """Root group: a `ZebraError` prints as one line with its fix; anything else as one line plus a hint. Its
    help is drawn by `zebra.cli._help` (the help users type most, without Typer's heavy renderer)."""

    def format_help(self, ctx, formatter) -> None:
        print_group_help(self, ctx)

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as e:  # the root's own options: `zebra --bogus`
            if not is_usage_error(e):
                raise
            show_usage_error(e)
            raise typer.Exit(USAGE_EXIT) from None

    def invoke(self, ctx):
        try:
            result = super().invoke(ctx)
            flush_stdout()  # a full stdout said here, as one line, not by the interpreter's last flush
            return result
        except ZebraError as e:
            out.error(e.message)  # out escapes it: a message may hold brackets ("dict[str, int]", paths)
            if e.fix:
                out.hint(e.fix)
            raise typer.Exit(e.exit_code) from None
        except UsageError as e:  # a flag's type or range, an unknown option: two lines, not a box
            if not is_usage_error(e):
                raise
            show_usage_error(e)
            raise typer.Exit(USAGE_EXIT) from None
        except KeyboardInterrupt:
            out.error("interrupted")
            raise typer.Exit(130) from None
        except Exception as e:
            if _is_cli_control(e) or os.environ.get("ZEBRA_DEBUG"):
                raise
            if isinstance(e, BrokenPipeError) and stdout_reader_gone():  # `zebra generate ... | head`
                leave_on_broken_pipe()
            out.error(f"{type(e).__name__}: {e}")
            out.hint(
                "this looks like a bug in zebra; rerun with ZEBRA_DEBUG=1 for the traceback and report it"
            )
            raise typer.Exit(1) from None


def _is_cli_control(e: BaseException) -> bool:
    """Exit, abort and usage errors belong to the CLI framework, which renders them itself."""
    return isinstance(e, typer.Exit | typer.Abort) or type(e).__module__.startswith(("click", "typer"))


app = typer.Typer(
    name="zebra",
    cls=_ZebraGroup,
    help="Train, convert, verify, evaluate and chat with hybrid recurrent-attention (Zebra-Llama) models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        out.raw(f"zebra {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Train, convert, verify, evaluate and chat with hybrid recurrent-attention (Zebra-Llama) models."""
    quiet_library_noise()


app.add_typer(recipes.app, name="recipes")
app.command("train", epilog=train_cli.TRAIN_EXAMPLES)(train_cli.train)
app.command("plot", epilog=train_cli.PLOT_EXAMPLES)(train_cli.plot)
app.add_typer(jobs.app, name="jobs")
app.add_typer(data.app, name="data")
app.command("doctor", epilog=doctor.EPILOG)(doctor.doctor)
app.add_typer(bench.app, name="bench")
app.command("convert", epilog=convert_cli.CONVERT_EXAMPLES)(convert_cli.convert)
app.command("verify", epilog=convert_cli.VERIFY_EXAMPLES)(convert_cli.verify)
app.command("upcycle", epilog=upcycle_cli.EXAMPLES)(upcycle_cli.upcycle_command)
app.command("distill", epilog=distill_cli.EXAMPLES)(distill_cli.distill_command)
app.command("eval", epilog=eval_cli.EXAMPLES)(eval_cli.eval_command)
app.command("chat", epilog=chat_cli.EXAMPLES)(chat_cli.chat_command)
app.command("generate", epilog=generate_cli.EXAMPLES)(generate_cli.generate_command)


def main() -> None:
    try:
        try:
            app()
        finally:  # a command that ended with typer.Exit still has its output to flush
            flush_stdout()
    except StdoutFailed as e:  # outside a command's handler too: `zebra --help >&-`
        out.error(e.message)
        out.hint(e.fix or "")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
