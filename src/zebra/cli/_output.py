"""The one place Rich is used: tables, results, warnings, errors and JSON for every command."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from zebra.core.errors import ZebraError
from zebra.train.view import TrainView

PIPE_WIDTH = 160  # columns of stdout written to a pipe or file (a log, `| tee`, a Slurm job's output)
# The exit status after stdout's reader has gone (`zebra generate ... | head`). Python ignores SIGPIPE, so a write
# raises BrokenPipeError instead of ending the process as it ends `cat` or `yes`; we end as they do, quietly, with
# the status a shell reports for them (128 + SIGPIPE): `set -o pipefail` treats zebra like any Unix tool, and a
# script can tell a cut-off output from a finished one. (Python's own recipe, Click and Rich use 1, which reads as
# a failure of the command.)
BROKEN_PIPE_EXIT = 141


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (so a BrokenPipeError came from stdout, not from a
    socket or a child process's pipe)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor; no poll() on this platform
        return False


def leave_on_broken_pipe() -> NoReturn:
    """End quietly after stdout's reader has gone: stdout points at /dev/null first, so the interpreter's last
    flush of what is still buffered cannot fail again and print a traceback."""
    with contextlib.suppress(OSError, ValueError):  # no file descriptor (an in-process test runner's stdout)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(BROKEN_PIPE_EXIT)


class StdoutFailed(ZebraError):
    """stdout cannot take the output: it is closed (`>&-`) or its disk is full (`> /dev/full`)."""


class GuardedStdout:
    """sys.stdout, whose failed writes (other than a gone reader's broken pipe, which ends quietly) become one
    `StdoutFailed` line instead of a traceback; after one, fd 1 points at /dev/null so that the interpreter's
    last flush cannot fail again. A closed stdout (`stream` None) fails at the first write."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def _fail(self, why: str) -> NoReturn:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        failed, self.stream = self.stream, open(os.devnull, "w")  # noqa: SIM115 (lives as long as stdout)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            failed.close()
        raise StdoutFailed(
            f"cannot write to stdout: {why}", fix="give it room, or redirect it (> FILE, > /dev/null)"
        )

    def write(self, text: str) -> int:
        if self.stream is None:
            self._fail("it is closed")
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as e:
            self._fail((e.strerror or type(e).__name__).lower())

    def flush(self) -> None:
        if self.stream is None:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:
            self._fail((getattr(e, "strerror", None) or str(e)).lower())

    def isatty(self) -> bool:
        return self.stream is not None and self.stream.isatty()

    def __getattr__(self, name: str) -> Any:
        if self.stream is None:
            raise AttributeError(name)
        return getattr(self.stream, name)


def guard_stdout() -> None:
    """Put `GuardedStdout` in place of sys.stdout (once; a test runner's own stdout is left alone)."""
    if sys.stdout is None or type(sys.stdout) is io.TextIOWrapper:
        sys.stdout = GuardedStdout(sys.stdout)


def flush_stdout() -> None:
    """Flush stdout as a command ends, so a full disk is told as one line while the root handler listens."""
    if sys.stdout is not None:
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()


def stdout_width() -> int | None:
    """Rich's width for stdout: None (the terminal's, or COLUMNS) on a terminal or with COLUMNS set, else
    PIPE_WIDTH: Rich's 80 columns would fold a table such as `zebra bench train`'s in the middle of its numbers."""
    tty = sys.stdout is not None and sys.stdout.isatty()
    return None if tty or os.environ.get("COLUMNS") else PIPE_WIDTH


class _Console(Console):
    def on_broken_pipe(self) -> None:  # Rich's own ends with status 1
        self.quiet = True
        leave_on_broken_pipe()


class Output:
    """Human output on stdout, errors and hints on stderr; `json()` for scripts."""

    def __init__(self) -> None:
        guard_stdout()
        # emoji off: a user's text such as `a:b:c` must not turn into an emoji (":b:")
        self.console = _Console(highlight=False, emoji=False, soft_wrap=False, width=stdout_width())
        self.stderr = _Console(stderr=True, highlight=False, emoji=False)

    def text(self, message: str = "", *, wrap: bool = True) -> None:
        """`wrap=False` for a line a user copies (a command): the terminal folds it, Rich does not break it."""
        self.console.print(message, soft_wrap=not wrap)

    def table(
        self,
        columns: list[str],
        rows: list[list[Any]],
        *,
        title: str | None = None,
        justify: dict[str, str] | None = None,
        optional: tuple[str, ...] = (),
        wrap: tuple[str, ...] | None = None,
    ) -> None:
        """A Rich table on stdout. `wrap`: the columns whose cells may wrap between words (the others are kept
        whole: names, paths, numbers); None lets every column fold. `optional` columns are left out, in that
        order, while the table cannot fit the terminal that way (`--json` keeps them)."""
        justify = justify or {}
        shown = list(range(len(columns)))
        while True:
            table = Table(title=title, header_style="bold", title_justify="left")
            for i in shown:
                name = columns[i]
                whole = wrap is not None and name not in wrap
                table.add_column(name, justify=justify.get(name, "left"), overflow="fold", no_wrap=whole)  # type: ignore[arg-type]
            for row in rows:
                table.add_row(*["" if row[i] is None else str(row[i]) for i in shown])
            drop = next((columns.index(c) for c in optional if columns.index(c) in shown), None)
            unbounded = self.console.options.update_width(1_000_000)  # its own width, not the terminal's
            if drop is None or self.console.measure(table, options=unbounded).minimum <= self.console.width:
                break
            shown.remove(drop)
        self.console.print(table)

    def result(self, message: str) -> None:
        self.console.print(f"[green]✓[/] {message}")

    # Messages are plain text: `[rank 1]` or `[127.0.0.1]:29500` in them must not be read as Rich markup. Each is
    # one line (soft_wrap): a log or `2> file` keeps it whole and grep finds it; a terminal wraps it itself.
    def warn(self, message: str) -> None:
        self.stderr.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)

    def error(self, message: str) -> None:
        self.stderr.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)

    def note(self, message: str) -> None:
        """What a command did on the user's behalf, on stderr (stdout stays the command's output)."""
        self.stderr.print(f"[dim]note:[/] {escape(message)}", soft_wrap=True)

    def hint(self, message: str) -> None:
        self.stderr.print(f"[dim]hint:[/] {escape(message)}", soft_wrap=True)

    def progress(
        self, description: str, total: float | None = None, unit: str = "it", *, enabled: bool = True
    ) -> ProgressBar:
        """A transient progress bar on stderr: count (or bytes when `unit` is "B"), rate, ETA and a note.

        The bar is itself the library's progress callback, `bar(done, total, note)`, so a command hands it over:

            with out.progress("converting", unit="B", enabled=not json_) as bar:
                convert(..., on_progress=bar)

        `enabled=False` draws nothing (e.g. with --json). Rich's own API works too (`bar.advance(bar.task_ids[0])`).
        """
        if unit == "B":
            counts: tuple[ProgressColumn, ...] = (DownloadColumn(), TransferSpeedColumn())
        else:
            counts = (MofNCompleteColumn(), RateColumn(unit))
        bar = ProgressBar(
            TextColumn("{task.description}"),
            BarColumn(),
            *counts,
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}", style="dim"),
            console=self.stderr,
            transient=True,
            disable=not enabled,
        )
        bar.add_task(description, total=total, note="")
        return bar

    def json(self, data: Any) -> None:
        self.raw(json.dumps(data, indent=2, default=str) + "\n")

    def raw(self, text: str) -> None:
        """`text` on stdout as it is (no markup, no wrapping): YAML, JSON, generated text."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def train_view(self) -> RichTrainView:
        """How a training run shows here: a live progress bar on a terminal, one line per log step otherwise."""
        return RichTrainView(self)


class ProgressBar(Progress):
    """A Rich `Progress` with one task that library code can drive as a plain callback."""

    def __call__(self, done: float, total: float | None = None, note: str = "") -> None:
        """The library's progress callback: `done` so far, `total` when known, and what is being done now."""
        self.update(self.task_ids[0], completed=done, total=total, note=note)


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


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def format_record(r: dict[str, Any]) -> str:
    """`loss 2.3456 | lr 3.00e-03 | 12.3k tok/s | MFU 41.2% | mem 1.2 GB` from a metrics record; a distillation
    record adds `KL 0.4321 | CE 2.9876 (teacher 2.5432)` after the loss."""
    parts = [f"loss {r['loss']:.4f}"]
    if r.get("hidden") is not None:  # ILD: per-layer output and mixer-output distances, summed over layers
        parts += [f"ILD outputs {r['hidden']:.4f}", f"mixers {r['mixer']:.4f}"]
    if r.get("kl") is not None:
        parts += [f"KL {r['kl']:.4f}", f"CE {r['ce']:.4f} (teacher {r['teacher_ce']:.4f})"]
    parts += [f"lr {r['lr']:.2e}", f"{r['tokens_per_s'] / 1e3:.1f}k tok/s"]
    if r.get("mfu") is not None:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    parts.append(f"mem {r['memory_gb']:.1f} GB")
    if r.get("skipped_steps"):
        parts.append(f"skipped {r['skipped_steps']}")
    return " | ".join(parts)


class RichTrainView(TrainView):
    """The trainer's reports on this console: a live bar with the latest figures on a terminal, one plain line
    per log step otherwise (logs, Slurm output files, pipes); warnings on stderr."""

    def __init__(self, output: Output, *, label: str = "", tokens_before: int = 0):
        """`label`: a name shown before the step (a pipeline's stage); `tokens_before`: tokens trained before
        this run (a pipeline's earlier stages), added to the run's own in the figures shown."""
        self.output, self.console = output, output.console
        self.label, self.tokens_before = label, tokens_before
        self.heldout = ""  # the latest validation figures, shown with every log line
        self.total = 0
        self._last = (0, time.perf_counter())  # (step, time) of the previous log line
        self._rate: float | None = None  # seconds per step, smoothed
        self._progress: Progress | None = None
        self._task = None

    def begin(self, *, step: int, total: int) -> None:
        self.total, self._last = total, (step, time.perf_counter())
        if not self.console.is_terminal:
            return
        self._progress = Progress(
            TextColumn(f"[bold]{escape(self.label)}step {{task.completed}}/{{task.total}}"),
            BarColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            TextColumn("{task.fields[stats]}"),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, completed=step, eta="-", stats="starting")

    def end(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def eta(self, step: int) -> float:
        """Seconds left, from a moving average of the recent seconds per step (start-up and slow spells fade)."""
        now = time.perf_counter()
        last_step, last_t = self._last
        if step > last_step:
            rate = (now - last_t) / (step - last_step)
            self._rate = rate if self._rate is None else 0.7 * self._rate + 0.3 * rate
            self._last = (step, now)
        return (self._rate or 0.0) * (self.total - step)

    def validated(self, step: int, val_loss: float, teacher_val_loss: float | None) -> None:
        teacher = f" (teacher {teacher_val_loss:.4f})" if teacher_val_loss is not None else ""
        self.heldout = f"held-out CE {val_loss:.4f}{teacher}"

    def stats(self, record: dict[str, Any]) -> str:
        """The figures of a log line: with a label, the tokens so far; the latest held-out CE; the record."""
        parts = [f"{self.tokens_before + record['tokens']:,} tokens"] if self.label else []
        parts += [self.heldout] if self.heldout else []
        return " | ".join([*parts, format_record(record)])

    def log(self, record: dict[str, Any]) -> None:
        step, eta = record["step"], format_duration(self.eta(record["step"]))
        if self._progress is not None:
            self._progress.update(self._task, completed=step, eta=eta, stats=self.stats(record))
        else:
            self.console.print(
                f"{self.label}step {step}/{self.total} | {self.stats(record)} | ETA {eta}", soft_wrap=True
            )

    def note(self, message: str) -> None:
        self.console.print(message, soft_wrap=True)

    def warn(self, message: str) -> None:
        self.output.warn(message)


out = Output()
