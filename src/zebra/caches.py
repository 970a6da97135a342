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
trainer, the benchmarks and the inference loaders call it. One value is not yours although it is set: the first
time inductor asks for its folder (any `torch.compile`, such as the decorators `import megatron.core` runs) it
writes its default, `$TMPDIR/torchinductor_USER`, into `os.environ`, and every child process inherits it. That
value counts as unset (`set_by_torch`): `use_kernel_cache()` replaces it, and launchers do not pass it to the
ranks (which then choose for themselves). Set to that very folder by hand, it is indistinguishable and moves too.

Python's own bytecode is the other half of a warm start: container images often set PYTHONDONTWRITEBYTECODE=1
(or run `python -B`), and where the installed packages ship no `__pycache__` every process then compiles the
~3,000 modules of torch, transformers and FLA from source: 10.6 s of a 20.6 s warm start of 1b-gdn-pure's bench
on the H200 machine (py-spy, docs/benchmarks.md). `use_bytecode_cache()`, run by every `zebra` process before it
imports anything heavy (zebra.cli), then writes bytecode to `bytecode_cache_dir()` instead: outside the install
and the source tree, which is what that setting keeps clean. Where the packages ship their bytecode (pip's
default) it changes nothing: Python reads theirs, and a prefix would make every new cache (a fresh container)
compile them all again, 11 s for torch and transformers on the CPU machine. `ZEBRA_PYCACHE` moves that folder (default
`$ZEBRA_CACHE/pycache`) or, set to 0, leaves Python's setting alone; a PYTHONPYCACHEPREFIX you set wins.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

KERNEL_CACHE_ENV = "ZEBRA_KERNEL_CACHE"
PYCACHE_ENV = "ZEBRA_PYCACHE"


def zebra_cache_dir(env: MutableMapping[str, str] = os.environ) -> Path:
    """`$ZEBRA_CACHE`, or `~/.cache/zebra`."""
    return Path(env.get("ZEBRA_CACHE") or Path.home() / ".cache" / "zebra").expanduser()


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


def set_by_torch(name: str, value: str) -> bool:
    """Whether `name=value` is a default torch wrote into the environment itself, not a choice: inductor's cache
    folder, set on its first use (any `torch.compile`, e.g. `import megatron.core`)."""
    return name == "TORCHINDUCTOR_CACHE_DIR" and os.path.abspath(value) == os.path.abspath(
        inductor_default_dir()
    )


def use_kernel_cache(env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set each cache variable that is not set yet (or holds torch's own default, `set_by_torch`) to its folder
    under `kernel_cache_dir()`; returns the values in effect (yours where you set one)."""
    for key, value in cache_settings(env).items():
        if key not in env or set_by_torch(key, env[key]):
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
