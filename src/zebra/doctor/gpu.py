"""GPU checks: what torch sees (count, name, memory, architecture, ROCm/CUDA versions) and the known-bad
FLA + Hopper + Triton combination.

`gather_gpus` is the only function that touches torch; the checks are pure functions of what it returns,
so every branch is testable on a machine without a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from zebra.core.errors import first_line
from zebra.doctor.check import Check, fail, ok, warn

MIN_ROCM = (7, 0)  # the Primus / Zebra-Llama guide's requirement
BAD_TRITON = ("3.4", "3.7.1")  # [lo, hi): FLA's gated GDN/KDA backward is wrong on Hopper (FLA #640)


@dataclass(frozen=True)
class GpuDevice:
    name: str
    memory_bytes: int
    arch: str  # "sm_90" (CUDA compute capability) or "gfx942" (ROCm gcnArchName without features)


@dataclass(frozen=True)
class GpuInventory:
    """What torch reports about accelerators.

    Args:
        backend: 'cuda' or 'rocm' (the torch build), 'cpu' (a CPU-only build), 'none' (torch missing).
        torch_version: torch.__version__, or None.
        runtime: CUDA runtime (torch.version.cuda) or HIP version (torch.version.hip) of the build.
        driver: NVIDIA driver version, or the ROCm version installed under /opt/rocm; None when unknown.
        devices: one entry per visible GPU.
        problem: why no device is visible although the build supports GPUs, if torch said so.
    """

    backend: str
    torch_version: str | None = None
    runtime: str | None = None
    driver: str | None = None
    devices: tuple[GpuDevice, ...] = field(default_factory=tuple)
    problem: str | None = None

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(d.arch for d in self.devices)


def gpu_device_nodes() -> bool:
    """True when the kernel exposes NVIDIA or AMD GPU device files."""
    return Path("/dev/nvidia0").exists() or Path("/dev/kfd").exists()


def _nvidia_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        r = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.split()
    return lines[0] if r.returncode == 0 and lines else None


def _rocm_installed() -> str | None:
    path = Path(os.environ.get("ROCM_PATH", "/opt/rocm")) / ".info" / "version"
    if not path.is_file():
        return None
    return path.read_text().strip().split("-")[0] or None


def gather_gpus() -> GpuInventory:
    """Ask torch (imported here) for the build and the visible devices; never raises for a missing GPU."""
    try:
        import torch

        from zebra.core.device import gpu_arch
    except ImportError:
        return GpuInventory(backend="none")
    hip, cuda = torch.version.hip, torch.version.cuda
    backend = "rocm" if hip else "cuda" if cuda else "cpu"
    if backend == "cpu":
        return GpuInventory(backend="cpu", torch_version=torch.__version__)
    driver = _rocm_installed() if backend == "rocm" else _nvidia_driver()
    devices, problem = [], None
    try:
        with warnings.catch_warnings(record=True) as caught:  # e.g. "CUDA initialization: driver too old"
            warnings.simplefilter("always")
            available = torch.cuda.is_available()
        for i in range(torch.cuda.device_count() if available else 0):
            p = torch.cuda.get_device_properties(i)
            devices.append(GpuDevice(p.name, int(p.total_memory), gpu_arch(i)))
        if not available:
            said = [first_line(str(w.message)) for w in caught if str(w.message).strip()]
            problem = said[0] if said else "torch.cuda.is_available() is False"
    except RuntimeError as e:  # a driver older than the build's runtime raises here
        problem = first_line(e)
    return GpuInventory(backend, torch.__version__, hip or cuda, driver, tuple(devices), problem)


def _version_tuple(text: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (text or "").split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits or digits != piece[: len(digits)]:
            break
        parts.append(int(digits))
    return tuple(parts)


def _describe(devices: tuple[GpuDevice, ...]) -> str:
    groups: dict[tuple[str, int, str], int] = {}
    for d in devices:
        key = (d.name, d.memory_bytes, d.arch)
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(
        f"{n} x {name} ({mem / 2**30:.1f} GiB, {arch})" for (name, mem, arch), n in groups.items()
    )


def check_gpus(inv: GpuInventory) -> Check:
    """GPU count, names, memory and architectures, with the ROCm (>= 7.0) or CUDA driver version."""
    if inv.backend == "none":
        return warn("gpu", "torch is not installed: cannot look for GPUs", "pip install torch==2.13.0")
    if inv.backend == "cpu":
        return warn(
            "gpu",
            f"no GPU: torch {inv.torch_version} is a CPU build (training runs on the CPU, slowly)",
            "on a GPU machine, install the CUDA or ROCm build of torch (https://pytorch.org/get-started/locally/)",
        )
    stack = f"CUDA {inv.runtime}" if inv.backend == "cuda" else f"ROCm (HIP {inv.runtime})"
    driver = f", driver {inv.driver}" if inv.backend == "cuda" and inv.driver else ""
    if inv.backend == "rocm" and inv.driver:
        driver = f", /opt/rocm {inv.driver}"
    if not inv.devices:
        smi = "nvidia-smi" if inv.backend == "cuda" else "rocm-smi"
        visible = "CUDA_VISIBLE_DEVICES" if inv.backend == "cuda" else "HIP_VISIBLE_DEVICES"
        why = f" ({inv.problem})" if inv.problem else ""
        return warn(
            "gpu",
            f"no GPU visible to torch {inv.torch_version} ({stack} build{driver}){why}",
            f"check `{smi}`, that the driver supports {stack}, and {visible}",
        )
    detail = f"{_describe(inv.devices)}; {stack}{driver}"
    if inv.backend == "rocm":
        rocm = _version_tuple(inv.runtime)[:2]
        if rocm and rocm < MIN_ROCM:
            need = ".".join(map(str, MIN_ROCM))
            return warn(
                "gpu",
                f"{detail}: ROCm {'.'.join(map(str, rocm))} is older than {need}, which the Zebra-Llama guide needs",
                f"use a ROCm >= {need} image (e.g. rocm/primus:v25.10) or a torch built for ROCm >= {need}",
            )
    if inv.backend == "cuda":
        old = [a for a in inv.archs if compute_capability(a) < (8, 0)]
        if old:
            return warn(
                "gpu",
                f"{detail}: {', '.join(sorted(set(old)))} has no bf16 tensor cores (sm_80+ needed for bf16)",
                "train with --set train.precision=fp32, or use an Ampere or newer GPU",
            )
    return ok("gpu", detail)


def compute_capability(arch: str) -> tuple[int, int]:
    """'sm_90' -> (9, 0), 'sm_120' -> (12, 0), 'sm_90a' -> (9, 0); (0, 0) for anything else (e.g. gfx942)."""
    m = re.fullmatch(r"sm_(\d+)(\d)a?", arch)
    return (int(m[1]), int(m[2])) if m else (0, 0)


def is_hopper(arch: str) -> bool:
    """sm_90 / sm_90a: NVIDIA Hopper (H100, H200)."""
    return compute_capability(arch)[0] == 9


def check_fla_triton_hopper(
    fla: str | None, triton: str | None, tilelang: str | None, archs: tuple[str, ...]
) -> Check:
    """The known-bad combination: FLA on Hopper with 3.4 <= Triton < 3.7.1 and no TileLang.

    Triton in that range miscompiles FLA's gated chunk backward on Hopper, so FLA refuses the GDN/KDA
    backward there (training stops at the first step). TileLang, when installed, takes that kernel over.

    Args:
        fla: flash-linear-attention version, or None when absent.
        triton: Triton version, or None.
        tilelang: tilelang version, or None.
        archs: the GPUs' architectures, e.g. ("sm_90",) or ("gfx942",).
    """
    from packaging.version import InvalidVersion, Version

    name = "fla-triton-hopper"
    lo, hi = BAD_TRITON
    if fla is None:
        return ok(name, "not affected: FLA is not installed")
    hopper = sorted({a for a in archs if is_hopper(a)})
    if not hopper:
        where = f"GPUs are {', '.join(sorted(set(archs)))}" if archs else "no GPU"
        return ok(name, f"not affected: no Hopper GPU ({where})")
    if triton is None:
        return warn(
            name, f"FLA {fla} on Hopper without Triton: its kernels cannot run", f"pip install 'triton>={hi}'"
        )
    try:
        bad = Version(lo) <= Version(triton) < Version(hi)
    except InvalidVersion:
        return warn(name, f"cannot read the Triton version {triton!r}", f"pip install 'triton>={hi}'")
    if bad and tilelang:
        return ok(
            name,
            f"Triton {triton} is in the bad range [{lo}, {hi}) on {hopper[0]}, "
            f"but tilelang {tilelang} takes over FLA's gated backward",
        )
    if bad:
        return fail(
            name,
            f"FLA {fla} refuses the GDN/KDA backward on Hopper ({hopper[0]}) with Triton {triton} "
            f"(known-bad range [{lo}, {hi}))",
            f"pip install 'triton>={hi}'   (or: pip install tilelang)",
        )
    return ok(name, f"Triton {triton} on {hopper[0]} is outside the known-bad range [{lo}, {hi})")
