"""Host checks: the Hugging Face token for gated tokenizers, the kernel and bytecode caches (warm starts), and free
disk for the data.

The token's value is never read into a message: only whether it is set.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zebra.core.caches import (
    KERNEL_CACHE_ENV,
    PYCACHE_ENV,
    bytecode_cache_dir,
    cache_settings,
    torch_ships_bytecode,
    torch_writes,
)
from zebra.doctor.check import Check, ok, warn

# Disk a FineWeb-Edu sample needs, download plus tokenized Megatron files (int32 ids), rounded up.
SAMPLE_DISK_BYTES = {"10BT": 50 * 10**9, "100BT": 500 * 10**9, "350BT": 1750 * 10**9}
GATED_EXAMPLE = "meta-llama/Llama-3.2-1B (most 1b/3b/8b recipes use a meta-llama tokenizer)"


def hf_token_path(env: Mapping[str, str] = os.environ) -> Path:
    """Where huggingface_hub caches the login token (HF_TOKEN_PATH, else $HF_HOME/token)."""
    if env.get("HF_TOKEN_PATH"):
        return Path(env["HF_TOKEN_PATH"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "token"


def check_hf_token(env: Mapping[str, str] = os.environ) -> Check:
    """HF_TOKEN set, or a token cached by `hf auth login`: needed to download gated tokenizers."""
    in_env = bool(env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN"))
    path = hf_token_path(env)
    cached = path.is_file() and bool(path.read_text().strip())
    cached_note = f"a cached login token is at {path}" if cached else "no cached login token"
    if in_env:
        var = "HF_TOKEN" if env.get("HF_TOKEN") else "HUGGING_FACE_HUB_TOKEN"
        return ok("hf-token", f"{var} is set; {cached_note}")
    if cached:
        return ok("hf-token", f"HF_TOKEN is not set, but {cached_note} (huggingface_hub uses it)")
    return warn(
        "hf-token",
        f"HF_TOKEN is not set and {cached_note}: gated tokenizers such as {GATED_EXAMPLE} cannot download",
        "export HF_TOKEN=<a read token from https://huggingface.co/settings/tokens>, or run `hf auth login`",
    )


def check_kernel_cache(env: Mapping[str, str] = os.environ) -> Check:
    """Where compiled GPU kernels and autotuning results persist between runs (`zebra.core.caches`): the folders in
    effect, what they hold, and whether they are writable and survive a reboot."""
    zebra_values = cache_settings(dict(env))
    theirs = torch_writes(env)  # torch's own folders, which the ranks' use_kernel_cache replaces: not yours
    effective = {
        key: value if key in theirs or not env.get(key) else env[key] for key, value in zebra_values.items()
    }
    triton = Path(effective["TRITON_CACHE_DIR"]).expanduser()
    files, size = _folder_usage(triton)
    yours = [
        key for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR") if effective[key] != zebra_values[key]
    ]
    detail = (
        f"Triton kernels and autotuning results in {triton} ({files:,} files, {size / 1e6:,.0f} MB), "
        f"torch.compile in {effective['TORCHINDUCTOR_CACHE_DIR']}"
        + (f"; {' and '.join(yours)} set by you" if yours else "")
    )
    fix = f"export {KERNEL_CACHE_ENV}=<a folder kept between runs> (and unset TRITON_CACHE_DIR)"
    if not _existing(triton).is_dir():  # ZEBRA_CACHE naming a file: every command would refuse it
        return warn(
            "kernel-cache", f"cannot be made, a file is in the way: {_existing(triton)}; {detail}", fix
        )
    if not os.access(_existing(triton), os.W_OK):
        return warn("kernel-cache", f"not writable: {detail}", fix)
    if _existing(triton).is_relative_to(_existing(Path(tempfile.gettempdir()))):
        return warn("kernel-cache", f"under the temporary folder, emptied by a reboot: {detail}", fix)
    if effective["TRITON_CACHE_AUTOTUNING"] != "1":
        return warn(
            "kernel-cache",
            f"TRITON_CACHE_AUTOTUNING={effective['TRITON_CACHE_AUTOTUNING']}: some autotuning reruns every time; "
            + detail,
            "unset TRITON_CACHE_AUTOTUNING (zebra sets it to 1)",
        )
    return ok("kernel-cache", detail)


def check_bytecode(
    started_without: bool = bool(sys.flags.dont_write_bytecode),
    state: Any = sys,
    env: Mapping[str, str] = os.environ,
    shipped: bool | None = None,
) -> Check:
    """Whether Python's compiled modules persist between runs. `started_without`: Python started with
    PYTHONDONTWRITEBYTECODE or -B; `state` (the `sys` module) holds what zebra.core.caches made of it; `shipped`:
    torch is installed with its compiled modules (default: looked up)."""
    if not started_without:
        return ok("bytecode", "Python caches compiled modules next to their sources (__pycache__)")
    if not state.pycache_prefix and (torch_ships_bytecode() if shipped is None else shipped):
        return ok(
            "bytecode",
            "PYTHONDONTWRITEBYTECODE (or -B) is set, but the installed packages ship their compiled modules "
            "(torch has them), which Python reads: only zebra's own are compiled at each start",
        )
    if state.pycache_prefix and not state.dont_write_bytecode:
        files, size = _folder_usage(Path(state.pycache_prefix))
        whose = (
            "zebra's"
            if Path(state.pycache_prefix) == bytecode_cache_dir(dict(env))
            else "PYTHONPYCACHEPREFIX's"
        )
        return ok(
            "bytecode",
            f"PYTHONDONTWRITEBYTECODE (or -B) is set; compiled modules go to {whose} cache {state.pycache_prefix} "
            f"({files:,} files, {size / 1e6:,.0f} MB), so a second run skips recompiling torch, transformers and FLA",
        )
    return warn(
        "bytecode",
        "PYTHONDONTWRITEBYTECODE (or -B) is set"
        + (f" and {PYCACHE_ENV}=0" if env.get(PYCACHE_ENV) == "0" else "")
        + ": every zebra run compiles the modules of torch, transformers and FLA from source again (10 s of a 1B "
        "recipe's 25 s warm start on the H200 machine)",
        f"unset {PYCACHE_ENV} (zebra then keeps bytecode in {bytecode_cache_dir({**env, PYCACHE_ENV: ''})})",
    )


def _folder_usage(folder: Path) -> tuple[int, int]:
    """(files, bytes) under `folder` (0, 0 when it does not exist yet)."""
    files = size = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            try:
                size += (Path(root) / name).stat().st_size
                files += 1
            except OSError:
                continue
    return files, size


def _existing(path: Path) -> Path:
    """`path`, or its nearest existing parent (the data folder may not exist yet)."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(data_dir: Path, need_bytes: int, purpose: str) -> Check:
    """Free space on the disk holding `data_dir` against `need_bytes`.

    Args:
        data_dir: where the data will go (need not exist yet).
        need_bytes: how much the planned work needs.
        purpose: what needs it, for the message (e.g. "--sample 10BT").
    """
    where = _existing(Path(data_dir))
    free = shutil.disk_usage(where).free
    shown = f"{free / 1e9:,.1f} GB free at {where}"
    need = f"{purpose} needs about {need_bytes / 1e9:,.0f} GB"
    if free >= need_bytes:
        return ok("disk", f"{shown} ({need})")
    return warn(
        "disk",
        f"only {shown}; {need}",
        "free some space, point --data-dir at a larger disk, or prepare a smaller --sample",
    )
