"""Backend choice: the torch reference everywhere, FLA's Triton kernels on CUDA/ROCm GPUs, and mamba-ssm's
Triton SSD kernel for the Mamba2 scan.

`resolve_backend("auto", device)` picks "fla" on a GPU when FLA imports and is healthy, else "torch", and logs
its choice once (logger "zebra_kernels"). "Healthy" excludes the known-bad combination FLA 0.6.0 refuses at
backward time: an NVIDIA Hopper GPU with 3.4 <= Triton < 3.7.1 and no tilelang. Every FLA call site shares
`refuse_broken_backward` (fail before the forward on that combination) and `as_fla_float` (no float64 on FLA).

"mamba_ssm" is FLA everywhere except the chunked Mamba2 scan, which runs mamba-ssm's
`mamba_chunk_scan_combined` (`resolve_ssd_backend`); `auto` takes the chunked scan from `SSD_AUTO_CHUNK_BACKEND`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from types import ModuleType

import torch

logger = logging.getLogger("zebra_kernels")

BACKENDS = ("auto", "torch", "fla", "mamba_ssm")
# The chunked (training / prefill) Mamba2 scan that backend="auto" runs on a GPU: "fla" (simple GLA) or
# "mamba_ssm" (mamba_chunk_scan_combined; falls back to "fla" when mamba-ssm does not import). Set from the
# whole training step, what users run, which was faster on mamba-ssm's scan, although the scan alone
# (`zebra bench ssd`) times FLA's path faster: the figures are in docs/benchmarks.md ("Mamba2 scan").
SSD_AUTO_CHUNK_BACKEND = "mamba_ssm"
MAMBA_SSM_SSD_MODULE = "mamba_ssm.ops.triton.ssd_combined"
FLA_MODULES = (
    "fla.ops.gated_delta_rule",
    "fla.ops.kda",
    "fla.ops.simple_gla",
    "fla.modules.activations",
    "fla.modules.causal_conv1d",
    "fla.modules.fused_cross_entropy",
    "fla.modules.norm.fused_norm_gate",
    "fla.modules.norm.layernorm",
    "fla.modules.norm.layernorm_gated",
)
_logged: set[str] = set()


def _log_once(message: str, level: int = logging.INFO) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.log(level, message)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@functools.cache
def fla_import_error() -> str | None:
    """None when FLA's ops import, else why not (one line)."""
    try:
        for module in FLA_MODULES:
            importlib.import_module(module)
    except Exception as error:  # FLA raises many kinds on broken installs (ImportError, RuntimeError, ...)
        return f"flash-linear-attention does not import ({type(error).__name__}: {error})"
    return None


@functools.cache
def mamba_ssm_ssd_module() -> ModuleType:
    """mamba-ssm's Triton SSD module (`mamba_chunk_scan_combined`), imported without its CUDA extensions.

    `import mamba_ssm` runs the package's `__init__`, which imports the Mamba1 op and with it
    `selective_scan_cuda`, a CUDA extension that a build without nvcc (`MAMBA_SKIP_CUDA_BUILD=TRUE`) lacks; the
    SSD kernels are pure Triton (they only try `causal_conv1d`, optionally). When the package import fails, the
    package is set up bare (its `__path__`, `__init__` not run) just long enough to import the SSD module.

    Raises:
        ImportError: mamba-ssm is not installed, or its SSD module does not import (e.g. no Triton).
    """
    try:
        return importlib.import_module(MAMBA_SSM_SSD_MODULE)
    except ImportError:
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None:
            raise
    bare = importlib.util.module_from_spec(spec)
    sys.modules["mamba_ssm"] = bare
    try:
        return importlib.import_module(MAMBA_SSM_SSD_MODULE)
    finally:  # `import mamba_ssm` elsewhere still gets the real package (or its own ImportError)
        if sys.modules.get("mamba_ssm") is bare:
            del sys.modules["mamba_ssm"]


@functools.cache
def mamba_ssm_import_error() -> str | None:
    """None when mamba-ssm's SSD kernel imports, else why not (one line, with the install command)."""
    try:
        mamba_ssm_ssd_module()
    except Exception as error:  # a broken install can raise more than ImportError
        return (
            f"mamba-ssm's SSD kernel does not import ({type(error).__name__}: {error}); install it with "
            "pip install wheel && MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip install "
            "--no-build-isolation 'zebra-llama[mamba]'"
        )
    return None


@functools.cache
def fla_backward_blocker(device_index: int = 0) -> str | None:
    """FLA 0.6.0 refuses the gated chunk backward on Hopper with 3.4 <= Triton < 3.7.1 (wrong results
    upstream, FLA issue #640) unless tilelang is installed. Returns the reason with the fix, or None."""
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return None
    try:
        import triton
    except ImportError:
        return None
    hopper = torch.cuda.get_device_capability(device_index)[0] == 9
    bad_triton = (3, 4, 0) <= _version_tuple(triton.__version__) < (3, 7, 1)
    if hopper and bad_triton and importlib.util.find_spec("tilelang") is None:
        return (
            f"FLA's GDN/KDA/SSD backward is refused on Hopper with Triton {triton.__version__} "
            "(3.4 <= Triton < 3.7.1 gives wrong gradients, FLA #640); "
            "fix: pip install 'triton>=3.7.1' (or pip install tilelang)"
        )
    return None


def refuse_broken_backward(*inputs: torch.Tensor | None) -> None:
    """Raise before an FLA forward when FLA would refuse (or get wrong) the backward on this GPU."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
        blocker = fla_backward_blocker(torch.cuda.current_device())
        if blocker is not None:
            raise RuntimeError(blocker + "; or run with backend='torch'")


def as_fla_float(x: torch.Tensor | None) -> torch.Tensor | None:
    """FLA kernels take fp32/bf16/fp16; float64 (the reference dtype) goes down to float32."""
    return x.float() if x is not None and x.dtype == torch.float64 else x


def _device(device: torch.device | str | None) -> torch.device:
    return torch.device("cpu") if device is None else torch.device(device)


def resolve_backend(backend: str, device: torch.device | str | None) -> str:
    """The backend that will run on `device`: "torch" or "fla".

    Args:
        backend: "auto" (FLA on a healthy CUDA/ROCm GPU, else torch), "torch", "fla", or "mamba_ssm" (FLA for
            every op but the Mamba2 scan, see `resolve_ssd_backend`).
        device: the device of the inputs (torch.device or string); None means CPU.

    Returns:
        "torch" or "fla".

    Raises:
        ValueError: unknown backend, or "fla" / "mamba_ssm" asked for on a non-GPU device or without a working FLA.

    Examples:
        >>> resolve_backend("auto", "cpu")
        'torch'
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dev = _device(device)
    if backend == "torch":
        return "torch"
    if backend in ("fla", "mamba_ssm"):
        if dev.type != "cuda":
            raise ValueError(
                f"backend={backend!r} needs a CUDA/ROCm GPU: FLA kernels have no CPU path (inputs are on {dev}); "
                "use backend='torch' or backend='auto'"
            )
        error = fla_import_error()
        if error is not None:
            raise ValueError(
                f"backend={backend!r} unavailable: {error}; install zebra-llama[gpu] or use backend='torch'"
            )
        return "fla"
    # auto
    if dev.type != "cuda":
        _log_once(f"zebra_kernels: backend 'torch' (inputs on {dev.type}; FLA kernels need a GPU)")
        return "torch"
    reason = fla_import_error() or fla_backward_blocker(dev.index or 0)
    if reason is not None:
        _log_once(f"zebra_kernels: backend 'torch' on {dev} because {reason}", logging.WARNING)
        return "torch"
    _log_once(f"zebra_kernels: backend 'fla' (FLA Triton kernels on {dev})")
    return "fla"


def resolve_fusible_backend(backend: str, device: torch.device | str | None) -> str:
    """`resolve_backend` for the ops torch.compile fuses by itself (the pre-norm with its residual add, SwiGLU's
    product): "torch" while compiling, so inductor fuses them with their neighbours (e.g. FP8's casts) instead
    of tracing our Triton kernels; else `resolve_backend`'s choice.

    Examples:
        >>> resolve_fusible_backend("auto", "cpu")
        'torch'
    """
    return "torch" if torch.compiler.is_compiling() else resolve_backend(backend, device)


def resolve_ssd_backend(backend: str, device: torch.device | str | None, mode: str) -> str:
    """The backend of one Mamba2 SSD scan: "torch", "fla" or "mamba_ssm".

    mamba-ssm serves the chunked scan (`mode="chunk"`) only: `backend="mamba_ssm"` runs it there and FLA's
    recurrent kernel for decode; `backend="auto"` runs it where `SSD_AUTO_CHUNK_BACKEND` says so and mamba-ssm
    imports (else FLA's, logged once). Everything else is `resolve_backend`'s choice.

    Raises:
        ValueError: as `resolve_backend`, or "mamba_ssm" asked for where mamba-ssm does not import.

    Examples:
        >>> resolve_ssd_backend("auto", "cpu", "chunk")
        'torch'
    """
    chosen = resolve_backend(backend, device)
    wants = backend == "mamba_ssm" or (backend == "auto" and SSD_AUTO_CHUNK_BACKEND == "mamba_ssm")
    if chosen != "fla" or mode != "chunk" or not wants:
        return chosen
    error = mamba_ssm_import_error()
    if error is None:
        return "mamba_ssm"
    if backend == "mamba_ssm":
        raise ValueError(f"backend='mamba_ssm' unavailable: {error}")
    # FLA's scan is correct and only a few percent slower in the step: said once, not warned
    _log_once(f"zebra_kernels: Mamba2 scan on FLA's kernels (mamba-ssm's are faster) because {error}")
    return "fla"
