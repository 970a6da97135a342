"""RMSNorm torch references: the plain norm with an optional fused residual add (FLA's `rms_norm` with
`prenorm=True`), and the gated norm: FLA's FusedRMSNormGated (norm, then gate) and the Mamba2/Megatron variant
(gate, then a grouped norm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def torch_rms_norm_gated(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    activation: str,
    norm_before_gate: bool,
    group_size: int | None,
) -> torch.Tensor:
    """Args/shapes as `zebra_kernels.rms_norm_gated`; computes in x's dtype (the caller upcasts)."""
    act = F.silu if activation in ("swish", "silu") else torch.sigmoid
    if not norm_before_gate:
        x = x * act(gate)
    C = x.shape[-1]
    groups = x.unflatten(-1, (C // (group_size or C), group_size or C))  # [..., C/gs, gs]
    y = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)  # [..., C]
    if weight is not None:
        y = y * weight
    return y * act(gate) if norm_before_gate else y


def torch_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Args/shapes as `zebra_kernels.rms_norm`; computes in `dtype`. Returns (y in x's dtype, the stream
    `x + residual` in residual's dtype, or x itself without a residual)."""
    h = x.to(dtype) if residual is None else x.to(dtype) + residual.to(dtype)  # [..., C]
    stream = x if residual is None else h.to(residual.dtype)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(dtype)
    return y.to(x.dtype), stream
