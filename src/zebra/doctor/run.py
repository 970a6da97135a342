"""Run every doctor check in order; a check that crashes becomes a failed row, never a traceback."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from zebra.core.errors import ZebraError
from zebra.doctor.check import Check, fail
from zebra.doctor.collectives import check_collective_env
from zebra.doctor.gpu import GpuInventory, check_fla_triton_hopper, check_gpus, gather_gpus, gpu_device_nodes
from zebra.doctor.host import (
    SAMPLE_DISK_BYTES,
    check_bytecode,
    check_disk,
    check_hf_token,
    check_kernel_cache,
)
from zebra.doctor.packages import (
    PACKAGES,
    check_packages,
    check_python,
    check_torch,
    declared_spec,
    installed,
)
from zebra.doctor.services import check_docker, check_slurm

CHECK_NAMES = (
    "python",
    "torch",
    "transformers",
    "megatron-core",
    "fla",
    "triton",
    "mamba-ssm",
    "torchao",
    "lm-eval",
    "gpu",
    "fla-triton-hopper",
    "nccl-env",
    "docker",
    "slurm",
    "hf-token",
    "kernel-cache",
    "bytecode",
    "disk",
)


def _guarded(name: str, fn: Callable[[], Check | list[Check]]) -> list[Check]:
    try:
        result = fn()
    except Exception as e:
        if os.environ.get("ZEBRA_DEBUG"):
            raise
        return [
            fail(
                name,
                f"the check itself crashed: {type(e).__name__}: {e}",
                "rerun with ZEBRA_DEBUG=1 and report it",
            )
        ]
    return result if isinstance(result, list) else [result]


def _version(dist: str) -> str | None:
    found = installed([dist])
    return found[1] if found else None


def _torch_check(inv: GpuInventory) -> Check:
    backend = inv.backend if inv.backend != "none" else "cpu"
    return check_torch(inv.torch_version, declared_spec("torch"), backend, inv.runtime, gpu_device_nodes())


def _hopper_check(inv: GpuInventory) -> Check:
    triton = installed(next(p.dists for p in PACKAGES if p.name == "triton"))
    return check_fla_triton_hopper(
        _version("flash-linear-attention"), triton[1] if triton else None, _version("tilelang"), inv.archs
    )


def _gather() -> tuple[GpuInventory, Check | None]:
    """The GPU inventory, or an empty one plus a failed `gpu` row when asking torch crashed."""
    try:
        return gather_gpus(), None
    except Exception as e:
        if os.environ.get("ZEBRA_DEBUG"):
            raise
        return GpuInventory(backend="none"), fail(
            "gpu", f"asking torch about GPUs crashed: {type(e).__name__}: {e}"
        )


def promote(checks: Iterable[Check], required: Iterable[str]) -> list[Check]:
    """Checks whose name is in `required` turn a warn into a fail (`zebra doctor --require docker`)."""
    required = set(required)
    return [
        Check(c.name, "fail", c.detail, c.fix) if c.status == "warn" and c.name in required else c
        for c in checks
    ]


def validate_required(names: Iterable[str]) -> list[str]:
    """The `--require` names, each one a known check (else a ZebraError suggesting the closest)."""
    names = [n.strip() for item in names for n in item.split(",") if n.strip()]
    for n in names:
        if n not in CHECK_NAMES:
            close = difflib.get_close_matches(n, CHECK_NAMES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ZebraError(f"--require {n}: unknown check", fix=f"{hint}known: {', '.join(CHECK_NAMES)}")
    return names


def run_checks(data_dir: Path = Path("."), sample: str = "10BT", required: Iterable[str] = ()) -> list[Check]:
    """Every check, in `CHECK_NAMES` order.

    Args:
        data_dir: where data will be prepared (the disk check measures its disk).
        sample: the FineWeb-Edu sample planned (`10BT`, `100BT`, `350BT`), for the disk check.
        required: check names whose warn is a fail here (e.g. `docker` on a machine that must run it).
    """
    if sample not in SAMPLE_DISK_BYTES:
        raise ZebraError(
            f"--sample {sample}: unknown sample", fix=f"use one of {', '.join(SAMPLE_DISK_BYTES)}"
        )
    required = validate_required(required)
    inv, crashed = _gather()
    checks = [
        *_guarded("python", check_python),
        *_guarded("torch", lambda: _torch_check(inv)),
        *_guarded("packages", check_packages),
        *([crashed] if crashed else _guarded("gpu", lambda: check_gpus(inv))),
        *_guarded("fla-triton-hopper", lambda: _hopper_check(inv)),
        *_guarded("nccl-env", lambda: check_collective_env(os.environ, inv)),
        *_guarded("docker", check_docker),
        *_guarded("slurm", check_slurm),
        *_guarded("hf-token", check_hf_token),
        *_guarded("kernel-cache", check_kernel_cache),
        *_guarded("bytecode", check_bytecode),
        *_guarded("disk", lambda: check_disk(data_dir, SAMPLE_DISK_BYTES[sample], f"--sample {sample}")),
    ]
    return promote(checks, required)
