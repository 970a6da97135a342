"""NCCL / RCCL environment worth setting before a multi-GPU run.

A pure function of the environment and the GPU inventory: the same advice the Primus launch scripts encode
(RCCL/HSA on ROCm), plus the watchdog timeout and, on shared multi-GPU Hopper hosts, NVLink multicast off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zebra.doctor.check import Check, ok, warn
from zebra.doctor.gpu import GpuInventory, compute_capability


@dataclass(frozen=True)
class Setting:
    var: str
    value: str
    why: str


COMMON = (
    Setting(
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
        "1800",
        "the NCCL watchdog aborts a rank whose heartbeat stalls 480 s (the default); a long first-step "
        "compile or checkpoint write needs more",
    ),
)
NVLS = (
    Setting(
        "NCCL_NVLS_ENABLE",
        "0",
        "on shared multi-GPU Hopper+ hosts NVLink multicast (NVLS) must stay off: a job using it can take "
        "the host's GPUs out of service",
    ),
    Setting("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", "the same for PyTorch's symmetric memory"),
)
ROCM = (
    Setting(
        "HSA_NO_SCRATCH_RECLAIM", "1", "scratch reclaim makes large training runs crash or stall on MI300"
    ),
    Setting(
        "RCCL_MSCCL_ENABLE", "0", "MSCCL is less stable than plain RCCL collectives (Primus turns it off)"
    ),
    Setting("NCCL_CHECKS_DISABLE", "1", "skips per-call argument checks in RCCL (Primus default)"),
    Setting("GPU_MAX_HW_QUEUES", "2", "fewer hardware queues give steadier step times (Primus default)"),
    Setting("TORCH_NCCL_HIGH_PRIORITY", "1", "collectives on high-priority streams overlap better"),
)
NOISY = {"NCCL_DEBUG": ("INFO", "TRACE"), "RCCL_DEBUG": ("INFO", "TRACE")}


def recommended(inv: GpuInventory) -> tuple[Setting, ...]:
    """The settings worth having for this machine's GPUs."""
    settings = COMMON
    if inv.backend == "rocm":
        settings += ROCM
    if (
        inv.backend == "cuda"
        and len(inv.devices) > 1
        and any(compute_capability(a) >= (9, 0) for a in inv.archs)
    ):
        settings += NVLS
    return settings


def check_collective_env(env: Mapping[str, str], inv: GpuInventory) -> Check:
    """Which recommended NCCL/RCCL variables are unset (an explicit value, even a different one, is kept)."""
    name = "nccl-env"
    if not inv.devices:
        return warn(name, "no GPU: NCCL/RCCL settings not checked")
    settings = recommended(inv)
    missing = [s for s in settings if s.var not in env]
    noisy = [f"{var}={env[var]}" for var, levels in NOISY.items() if env.get(var, "").upper() in levels]
    problems = []
    if missing:
        problems.append("unset: " + "; ".join(f"{s.var} ({s.why})" for s in missing))
    if noisy:
        problems.append(f"{', '.join(noisy)} logs every collective (slow, huge logs)")
    if not problems:
        return ok(name, "set: " + ", ".join(f"{s.var}={env[s.var]}" for s in settings))
    fix = " ".join(f"{s.var}={s.value}" for s in missing)
    fix = f"export {fix}" if fix else ""
    if noisy:
        fix = (fix + "; " if fix else "") + "unset NCCL_DEBUG / RCCL_DEBUG (or set WARN) outside debugging"
    return warn(name, "; ".join(problems), fix)
