"""zebra's cache folders: the root (`$ZEBRA_CACHE`, default ~/.cache/zebra: the tokenized sample corpus, the job
registry, kernels, bytecode) and the kernel and bytecode caches that give warm starts.

Warm starts: where compiled GPU kernels and autotuning results persist between runs.

Triton compiles every GPU kernel zebra runs (FLA's and torch.compile's) on first use and autotunes many of them;
on a fresh machine that is minutes before a 1B model's first step. Kept on disk, a second run skips both:
- compiled Triton kernels: `TRITON_CACHE_DIR` (Triton's default, ~/.triton/cache, also persists; zebra moves it
  under its own folder so that one place holds everything and one variable moves it);
- autotuning results: Triton stores them next to the kernels for an autotuner with `cache_results` (FLA 0.6.0
  asks for it on its kernels through `FLA_CACHE_RESULTS`, on by default) and, with `TRITON_CACHE_AUTOTUNING=1`
  (set here), for every other autotuner too. FLA keeps no autotuning cache of its own: its `FLA_CACHE_MODE` /
  `FLA_CONFIG_DIR` only read per-GPU config files (off by default) and write nothing;
- torch.compile (inductor) artefacts: `TORCHINDUCTOR_CACHE_DIR` (default: under /tmp, which a reboot or a fresh
  container empties).

`use_kernel_cache()` points these at `kernel_cache_dir()` unless they are set already (a value you set wins).
Triton and inductor read them when they compile, so it works when called any time before the first kernel; the
trainer, the benchmarks and the inference loaders call it.

Some values are not yours although they are set: torch, Triton and FLA write defaults of their own into
`os.environ` (`TORCH_WRITES`, read in their sources; every child process inherits them). The first time inductor
asks for its folder (any `torch.compile`, such as the decorators `import megatron.core` runs) it writes
`$TMPDIR/torchinductor_USER` as TORCHINDUCTOR_CACHE_DIR; its first Triton kernel on a GPU writes
`<that folder>/triton/<device>` as TRITON_CACHE_DIR; a spawned compile pool writes TORCH_WARM_POOL=0, and so on.
Such a value counts as unset (`set_by_torch`): `use_kernel_cache()` replaces it, launchers do not hand it to the
ranks (which then choose for themselves) and `zebra doctor` does not call it yours. The two folders are told by
their value alone, inherited or not (set to that very folder by hand, one is indistinguishable and moves too);
the other values are also choices one makes (`export TORCH_WARM_POOL=0`), so they count as torch's only when
this process did not start with them (`started_environment()`: a value exported in the shell is forwarded).

Python's own bytecode is the other half of a warm start: container images often set PYTHONDONTWRITEBYTECODE=1
(or run `python -B`), and where the installed packages ship no `__pycache__` every process then compiles the
~3,000 modules of torch, transformers and FLA from source, about half of a warm start (docs/benchmarks.md, "Warm
start"). `use_bytecode_cache()`, run by every `zebra` process before it
imports anything heavy (zebra.cli), then writes bytecode to `bytecode_cache_dir()` instead: outside the install
and the source tree, which is what that setting keeps clean. Where the packages ship their bytecode (pip's
default) it changes nothing: Python reads theirs, and a prefix would make every new cache (a fresh container)
compile them all again. `ZEBRA_PYCACHE` moves that folder (default
`$ZEBRA_CACHE/pycache`) or, set to 0, leaves Python's setting alone; a PYTHONPYCACHEPREFIX you set wins.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

KERNEL_CACHE_ENV = "ZEBRA_KERNEL_CACHE"
PYCACHE_ENV = "ZEBRA_PYCACHE"


def zebra_cache_dir(env: MutableMapping[str, str] = os.environ) -> Path:
    """`$ZEBRA_CACHE`, or `~/.cache/zebra`."""
    return Path(env.get("ZEBRA_CACHE") or Path.home() / ".cache" / "zebra").expanduser()


CACHE_FIX = "set ZEBRA_CACHE to a folder you can write (default ~/.cache/zebra)"


def make_cache_folder(folder: Path) -> Path:
    """`folder`, a folder of zebra's cache, created and able to take a file; or a one-line ZebraError naming it
    and ZEBRA_CACHE (a file in the way, a read-only place, a full disk)."""
    from zebra.core.atomic import check_writable
    from zebra.core.errors import ZebraError

    try:
        check_writable(folder, fix=CACHE_FIX)
    except ZebraError as e:
        raise ZebraError(e.message, fix=CACHE_FIX) from None
    return folder


def kernel_cache_dir(env: MutableMapping[str, str] = os.environ) -> Path:
    """`$ZEBRA_KERNEL_CACHE`, else `$ZEBRA_CACHE/kernels`, else `~/.cache/zebra/kernels`."""
    if env.get(KERNEL_CACHE_ENV):
        return Path(env[KERNEL_CACHE_ENV]).expanduser()
    return zebra_cache_dir(env) / "kernels"


def cache_settings(env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """The variables `use_kernel_cache` sets, with zebra's values (before any value already in `env`)."""
    root = kernel_cache_dir(env)
    return {
        "TRITON_CACHE_DIR": str(root / "triton"),
        "TRITON_CACHE_AUTOTUNING": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
    }


def inductor_default_dir() -> str:
    """The folder inductor uses when TORCHINDUCTOR_CACHE_DIR is unset, and then writes into `os.environ`:
    `torch._inductor.runtime.cache_dir_utils.default_cache_dir()`, computed as torch does without importing it
    (tests/test_caches.py compares the two)."""
    import getpass
    import re
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def inductor_triton_dir(env: Mapping[str, str] = os.environ) -> str:
    """The folder, less its `/<device index>`, that inductor's first Triton kernel writes as TRITON_CACHE_DIR when
    that is unset: `torch._inductor.runtime.cache_dir_utils.triton_cache_dir(device)` (inductor's folder in
    effect, then `triton/<device>`)."""
    return os.path.join(
        os.path.abspath(env.get("TORCHINDUCTOR_CACHE_DIR") or inductor_default_dir()), "triton"
    )


def _same_path(value: str, path: str) -> bool:
    return bool(value) and os.path.abspath(value) == os.path.abspath(path)


def _torch_file(*parts: str) -> str | None:
    """A file of the installed torch package (found without importing torch), or None without torch."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    return os.path.join(os.path.dirname(spec.origin), *parts) if spec and spec.origin else None


# What torch, Triton and FLA write into os.environ themselves, each with a value of their own (torch 2.13, Triton
# 3.9, FLA 0.6: tests/test_caches.py scans their sources for a write this table lacks): name -> whether `value` is
# theirs, given the rest of the environment. Megatron's NCCL/UCX writes happen only in a rank's process group set-up.
TORCH_WRITES: dict[str, Callable[[str, Mapping[str, str]], bool]] = {
    # inductor's folder, on its first use (cache_dir_utils.cache_dir)
    "TORCHINDUCTOR_CACHE_DIR": lambda value, env: _same_path(value, inductor_default_dir()),
    # inductor's first Triton kernel on a GPU (triton_heuristics.CachingAutotuner): <inductor's folder>/triton/<n>
    "TRITON_CACHE_DIR": lambda value, env: (
        os.path.dirname(os.path.abspath(value)) == inductor_triton_dir(env)
        and os.path.basename(value).isdigit()
    ),
    # "0" once inductor starts its compile workers by spawn (async_compile), so that they start no pool of their own
    "TORCH_WARM_POOL": lambda value, env: value == "0",
    # the ptxas a CUDA build of torch ships (torch/_inductor/bin), when inductor compiles for an NVIDIA GPU
    "TRITON_PTXAS_PATH": lambda value, env: _same_path(value, _torch_file("_inductor", "bin", "ptxas") or ""),
    # CUDA's libdevice, when inductor is asked for eager numerics (compile_tasks)
    "TRITON_LIBDEVICE_PATH": lambda value, env: value.endswith(
        os.path.join("nvvm", "libdevice", "libdevice.10.bc")
    ),
    # "ieee": FLA on an NVIDIA GPU without TF32, when imported (fla.utils.hardware)
    "TRITON_F32_DEFAULT": lambda value, env: value == "ieee",
}
# Of those, the folders nobody names by hand: torch's by their value alone, even inherited from a parent process.
TORCH_FOLDERS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

_IMPORTED_WITH = dict(os.environ)  # where /proc is missing: the environment when zebra was first imported


@functools.cache
def started_environment() -> Mapping[str, str]:
    """The environment this process started with: what the shell (or the parent process) exported, before torch
    or anything else here wrote into `os.environ`. Linux's `/proc/self/environ` keeps it (writes into os.environ
    do not change it); elsewhere, os.environ as it was when zebra.core.caches was first imported."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(_IMPORTED_WITH)
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {os.fsdecode(key): os.fsdecode(value) for key, value in pairs}


def set_by_torch(
    name: str, value: str, env: Mapping[str, str] = os.environ, started: Mapping[str, str] | None = None
) -> bool:
    """Whether `name=value` (in `env`) is a default torch, Triton or FLA wrote into the environment itself
    (`TORCH_WRITES`), not a choice: one of their folders (`TORCH_FOLDERS`), or another of their values that the
    process did not start with (`started`, default `started_environment()`)."""
    theirs = TORCH_WRITES.get(name)
    if theirs is None or not theirs(value, env):
        return False
    if name in TORCH_FOLDERS:
        return True
    return (started_environment() if started is None else started).get(name) != value


def torch_writes(env: Mapping[str, str] = os.environ, started: Mapping[str, str] | None = None) -> list[str]:
    """The names in `env` whose value torch, Triton or FLA wrote there (`set_by_torch`)."""
    return [name for name in TORCH_WRITES if name in env and set_by_torch(name, env[name], env, started)]


@contextlib.contextmanager
def without_torch_writes(env: MutableMapping[str, str] = os.environ) -> Iterator[list[str]]:
    """`env` without the values torch wrote there (`torch_writes`) while child processes that inherit it start
    (the ranks then choose for themselves); yields their names and puts back those still unset afterwards."""
    removed = {name: env.pop(name) for name in torch_writes(env)}
    try:
        yield list(removed)
    finally:
        for name, value in removed.items():
            env.setdefault(name, value)


def use_kernel_cache(env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set each cache variable that is not set yet (or holds torch's own default, `set_by_torch`) to its folder
    under `kernel_cache_dir()`; returns the values in effect (yours where you set one)."""
    # told before any is replaced: TRITON_CACHE_DIR's default depends on inductor's folder
    theirs = torch_writes(env)
    for key, value in cache_settings(env).items():
        if key not in env or key in theirs:
            env[key] = value
    return {key: env[key] for key in cache_settings(env)}


def bytecode_cache_dir(env: MutableMapping[str, str] = os.environ) -> Path | None:
    """Where zebra keeps Python's bytecode when Python is told to write none: `$ZEBRA_PYCACHE`, else
    `$ZEBRA_CACHE/pycache`; None when `ZEBRA_PYCACHE` is 0 (no such cache)."""
    value = env.get(PYCACHE_ENV)
    if value == "0":
        return None
    # absolute: Python resolves a relative prefix against the working directory of each import
    return (Path(value).expanduser() if value else zebra_cache_dir(env) / "pycache").absolute()


def torch_ships_bytecode() -> bool:
    """Whether torch, the largest package a zebra run imports, is installed with its compiled modules (pip's default;
    the GPU machine's image has none). Found without importing torch; False when torch is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    return Path(importlib.util.cache_from_source(spec.origin)).is_file()


def use_bytecode_cache(
    state: Any = sys, env: MutableMapping[str, str] = os.environ, shipped: bool | None = None
) -> Path | None:
    """If `state` (the `sys` module) writes no bytecode, has no `pycache_prefix`, and the installed packages ship
    none either (`shipped`, default `torch_ships_bytecode()`), write and read bytecode in `bytecode_cache_dir()`
    from now on (Python reads both settings at each import). Where the packages ship theirs, Python reads those:
    a prefix would make it compile everything once more. Returns the folder, or None where Python's own setting
    stands."""
    folder = bytecode_cache_dir(env)
    if folder is None or not state.dont_write_bytecode or state.pycache_prefix:
        return None
    if torch_ships_bytecode() if shipped is None else shipped:
        return None
    state.pycache_prefix = str(folder)
    state.dont_write_bytecode = False
    return folder
