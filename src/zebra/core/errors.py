"""The one exception type for mistakes a user can fix.

A `ZebraError` carries a one-line message naming the file, key or flag at fault and, where known, the fix.
The CLI prints it as a single line (no traceback) and exits with `exit_code`.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from pathlib import Path


class ZebraError(Exception):
    """A user-facing error: `message` says what is wrong, `fix` says what to do about it."""

    def __init__(self, message: str, *, fix: str | None = None, exit_code: int = 1):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message


def first_line(error: BaseException | str, limit: int = 200) -> str:
    """The first non-blank line of a library exception's message (or of a text such as a tool's stderr), cut to
    `limit` characters, for a one-line ZebraError; an exception with an empty message gives its type's name."""
    line = next((s.strip() for s in str(error).splitlines() if s.strip()), "")
    if not line and isinstance(error, BaseException):
        return type(error).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_summary(error: BaseException, limit: int = 160) -> str:
    """`Type: first line of the message`, or the type alone for an empty message."""
    line = first_line(error, limit)
    return line if line == type(error).__name__ else f"{type(error).__name__}: {line}"


def yaml_problem(error: BaseException) -> tuple[int | None, str]:
    """A YAML parse error as (line, what): the 1-based line where the broken construct starts (or where the
    problem was found; None when the error has no position) and what is wrong, in one line."""
    mark = getattr(error, "context_mark", None) or getattr(error, "problem_mark", None)
    what = ", ".join(x for x in (getattr(error, "context", None), getattr(error, "problem", None)) if x)
    return (mark.line + 1 if mark else None), what or first_line(error)


@contextlib.contextmanager
def reading(
    path: str | Path, *, what: str = "", fix: str | None = None, also: tuple[type, ...] = ()
) -> Iterator[None]:
    """Read `path` inside this block: what its library raises for a broken file (cut short, not gzip, not JSON
    or YAML or parquet, not UTF-8, unreadable) becomes one ZebraError naming the file, `what` it should be and
    `fix`; `also`: more exception types that mean a broken file (e.g. yaml.YAMLError). A ZebraError passes as
    it is; anything else (a bug) too."""
    try:
        yield
    except ZebraError:
        raise
    except (OSError, EOFError, ValueError, zlib.error, *also) as e:
        if isinstance(e, BrokenPipeError):
            raise
        problem = read_problem(e)
        raise ZebraError(
            f"{path}: {problem}" + (f"; expected {what}" if what else ""),
            fix=fix
            or "check the file (or write it again); a copy cut short by a full disk or a kill reads so",
        ) from None


def read_problem(error: BaseException) -> str:
    """What a library's exception says about a file, in a few words: `not valid gzip (truncated)`."""
    import gzip
    import json

    if isinstance(error, EOFError):
        return "truncated (it ends before its data does)"
    if isinstance(error, gzip.BadGzipFile | zlib.error):
        return f"not valid gzip ({first_line(error, 80)})"
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON (line {error.lineno} column {error.colno}: {error.msg})"
    if isinstance(error, UnicodeDecodeError):
        return f"not valid UTF-8 (byte {error.start}: {error.object[error.start : error.start + 1]!r})"
    if type(error).__module__.startswith("yaml"):
        line, what = yaml_problem(error)
        return f"not valid YAML ({f'line {line}: ' if line else ''}{what})"
    if isinstance(error, OSError) and error.strerror:
        return f"cannot read it ({error.strerror})"
    return f"cannot read it ({error_summary(error, 120)})"
