"""Where a model runs and in which precision: the one reading of `--device` and `--dtype` for every command that
loads weights (eval, chat, generate, bench decode, convert and verify)."""

from __future__ import annotations

import torch

from zebra.core.errors import ZebraError

# --dtype names -> torch dtype names; `auto` has no dtype of its own (see `resolve_dtype`).
DTYPES = {"auto": None, "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def resolve_device(device: str | None = None) -> str:
    """`--device` as a torch device string: None or `auto` is cuda when there is one, else cpu.

    Raises:
        ZebraError: a CUDA device on a machine without one.
    """
    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ZebraError(f"--device {device}: no CUDA device on this machine", fix="pass --device cpu")
    return device


def resolve_dtype(name: str, device: str = "cpu", *, auto_on_gpu: str | None = None) -> torch.dtype | None:
    """`--dtype` as a torch dtype; None keeps the checkpoint's own (each tensor's, when converting).

    Args:
        name: auto, bf16, fp16, fp32 or fp64.
        device: where the model will run.
        auto_on_gpu: what `auto` means on a CUDA device, e.g. "bf16" for decoding (each step reads every weight,
            so half the bytes is close to twice the speed); None: the checkpoint's dtype there too.

    Raises:
        ZebraError: an unknown name.
    """
    if name not in DTYPES:
        raise ZebraError(f"--dtype {name}: unknown", fix=f"use one of {', '.join(DTYPES)}")
    if name == "auto" and auto_on_gpu is not None and device.startswith("cuda"):
        name = auto_on_gpu
    torch_name = DTYPES[name]
    return None if torch_name is None else getattr(torch, torch_name)


def gpu_arch(index: int | torch.device = 0) -> str:
    """A GPU's architecture as compilers name it: "sm_90" (CUDA compute capability) or "gfx942" (ROCm's
    gcnArchName without its feature flags)."""
    props = torch.cuda.get_device_properties(index)
    return props.gcnArchName.split(":")[0] if torch.version.hip else f"sm_{props.major}{props.minor}"
