"""Usage errors (a flag of the wrong type or out of its range, an unknown option or command, a missing argument)
in zebra's two lines, `error:` naming the flag and `hint:` the fix, exit status 2 as Click's own; instead of
Typer's box of five lines and more.

Typer (0.2x) parses with its own copy of Click (`typer._click`) and checks values with pydantic: a range error
reads `Invalid value for '--max-new': Input should be greater than or equal to 1`.
"""

from __future__ import annotations

import re
from typing import Any

try:  # Typer 0.2x's own copy of Click, which it parses with
    from typer._click.exceptions import (
        BadParameter,
        MissingParameter,
        NoArgsIsHelpError,
        NoSuchOption,
        UsageError,
    )
except ImportError:  # a Typer that parses with Click itself (pyproject allows typer>=0.20)
    from click.exceptions import BadParameter, MissingParameter, NoArgsIsHelpError, NoSuchOption, UsageError

from zebra.cli._output import out

USAGE_EXIT = 2  # Click's status for a usage error, kept
# pydantic's words for a bound -> the sign a fix shows
_BOUNDS = {
    "greater than or equal to": ">=",
    "less than or equal to": "<=",
    "greater than": ">",
    "less than": "<",
}


def is_usage_error(error: BaseException) -> bool:
    """A usage error zebra renders itself: not `NoArgsIsHelpError` (a group run bare, whose "error" is its help)."""
    return isinstance(error, UsageError) and not isinstance(error, NoArgsIsHelpError)


def show_usage_error(error: Any) -> None:
    """Print a usage error as `error: MESSAGE` and `hint: FIX; COMMAND --help lists its options`, a line each."""
    out.error(" ".join(error.format_message().split()))
    command = error.ctx.command_path if getattr(error, "ctx", None) is not None else "zebra"
    out.hint(f"{usage_fix(error)}; {command} --help lists its options")


def usage_fix(error: Any) -> str:
    """What to pass instead: `pass --max-new a whole number >= 1`."""
    if isinstance(error, NoSuchOption):
        return "check the option's spelling"
    param = getattr(error, "param", None)
    if param is None:
        return "check the command line"
    name = flag_name(param)
    if isinstance(error, MissingParameter):
        return f"pass {name}"
    if not isinstance(error, BadParameter):
        return f"check {name}"
    kind = _value_kind(param)
    bounds = [f"{_BOUNDS[word]} {value}" for word, value in re.findall(
        r"(greater than or equal to|less than or equal to|greater than|less than) (-?[\d.e+]+)", error.message
    )]  # fmt: skip
    return f"pass {name} {kind}" + (f" {' and '.join(bounds)}" if bounds else "")


def flag_name(param: Any) -> str:
    """The name a user types: the longest `--flag` of an option, the upper-case name of an argument."""
    opts = [o for o in getattr(param, "opts", []) if o.startswith("-")]
    if opts and getattr(param, "param_type_name", "") == "option":
        return max(opts, key=len)
    return (getattr(param, "name", None) or "the argument").upper()


def _value_kind(param: Any) -> str:
    """`a whole number`, `a number` or `a valid value`, from the parameter's annotation when Typer has one."""
    try:
        annotation = param.get_runtime_param().annotation
    except Exception:  # another Typer's parameters: the generic words
        return "a valid value"
    return {int: "a whole number", float: "a number"}.get(annotation, "a valid value")
