"""How fast `zebra` starts, and whether starting it pulls in a heavy library.

Each run is a fresh interpreter executing exactly what the `zebra` console script does, so the figure is
what a user waits for. Imports are read from `python -X importtime`, which lists every module imported.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Top-level packages `zebra --help` must never import: each costs 0.1 s to several seconds.
HEAVY_MODULES = (
    "torch",
    "transformers",
    "fla",
    "megatron",
    "datasets",
    "lm_eval",
    "docker",
    "submitit",
    "triton",
    "pyarrow",
    "pandas",
    "huggingface_hub",
    "safetensors",
    "tokenizers",
)
# What the console script runs (argv[0] set so help text says `zebra`).
_ENTRY = "import sys; sys.argv[0] = 'zebra'; from zebra.cli.main import main; main()"
DEFAULT_COMMANDS = (("--help",), ("--version",), ("recipes", "list"))


def zebra_argv(args: Sequence[str], *, importtime: bool = False) -> list[str]:
    """The argv that runs `zebra ARGS` in a fresh interpreter."""
    return [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", _ENTRY, *args]


def imported_modules(args: Sequence[str], ok_exit_codes: Sequence[int] = (0,)) -> list[str]:
    """Every module `zebra ARGS` imports, in import order.

    Raises RuntimeError when the command exits with a code outside `ok_exit_codes`.
    """
    r = subprocess.run(zebra_argv(args, importtime=True), capture_output=True, text=True, timeout=120)
    if r.returncode not in ok_exit_codes:
        tail = [line for line in r.stderr.splitlines() if not line.startswith("import time:")][-5:]
        raise RuntimeError(f"`zebra {' '.join(args)}` exited {r.returncode}: {' / '.join(tail)}")
    names = []
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line: "self [us] | cumulative | imported package"
                names.append(name)
    return names


def heavy_imports(args: Sequence[str]) -> list[str]:
    """The heavy top-level packages (`HEAVY_MODULES`) that `zebra ARGS` imports, sorted."""
    return sorted({m.split(".")[0] for m in imported_modules(args)} & set(HEAVY_MODULES))


@dataclass(frozen=True)
class StartupTiming:
    """Wall times of one command over several fresh processes.

    Args:
        command: what ran, e.g. "zebra --help" or "python -c pass" (the interpreter's own start).
        seconds: one wall time per run.
        heavy: heavy packages it imported (None when not measured, as for the interpreter baseline).
    """

    command: str
    seconds: tuple[float, ...]
    heavy: tuple[str, ...] | None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    def to_dict(self) -> dict:
        return {
            "command": self.command,
            "median_s": self.median,
            "min_s": self.best,
            "runs": len(self.seconds),
            "heavy_imports": None if self.heavy is None else list(self.heavy),
        }


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        raise RuntimeError(f"{argv[-1]} exited {r.returncode}: {r.stderr.strip()[-300:]}")
    return elapsed


def measure_startup(
    commands: Sequence[Sequence[str]] = DEFAULT_COMMANDS,
    repeats: int = 10,
    on_progress: Callable[[float, float | None, str], None] | None = None,
) -> list[StartupTiming]:
    """Time `python -c pass` and each `zebra ARGS` over `repeats` fresh processes; list heavy imports.

    Args:
        commands: argument lists for `zebra`.
        repeats: runs per command (the median is reported).
        on_progress: called after every timed process with (processes done, (len(commands) + 1) * repeats,
            the command).
    """
    results = []
    jobs = [("python -c pass", [sys.executable, "-c", "pass"], None)]
    jobs += [(f"zebra {' '.join(args)}", zebra_argv(args), args) for args in commands]
    done, total = 0, len(jobs) * repeats
    for label, argv, args in jobs:
        _wall(argv)  # warm the page cache and .pyc files: the median then measures steady state
        times = []
        for _ in range(repeats):
            times.append(_wall(argv))
            done += 1
            if on_progress:
                on_progress(done, total, label)
        heavy = tuple(heavy_imports(args)) if args is not None else None
        results.append(StartupTiming(label, tuple(times), heavy))
    return results
