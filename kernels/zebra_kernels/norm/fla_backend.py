"""Gated RMSNorm on FLA's Triton kernels, GPU only (the plain RMSNorm is ours: `norm.triton_fused`).

- norm then gate (FLA's FusedRMSNormGated, swish or sigmoid): `fla.modules.norm.fused_norm_gate.rms_norm_gated`.
- gate then a grouped norm (Mamba2's RMSNormGated, silu): `fla.modules.norm.layernorm_gated.rmsnorm_fn`.
Other combinations reduce to these (a sigmoid gate before the norm is applied in torch; a grouped norm before
a gate runs the fused kernel per group on a reshaped view, with the weight applied after).
"""

from __future__ import annotations

import torch


def fla_rms_norm_gated(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None,
    *,
    eps: float,
    activation: str,
    norm_before_gate: bool,
    group_size: int | None,
) -> torch.Tensor:
    """Args/shapes as `zebra_kernels.rms_norm_gated`."""
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    from fla.modules.norm.layernorm_gated import rmsnorm_fn

    C = x.shape[-1]
    grouped = group_size is not None and group_size != C
    swish = activation in ("swish", "silu")
    if norm_before_gate and not grouped:
        return rms_norm_gated(x, gate, weight, None, activation="swish" if swish else "sigmoid", eps=eps)
    if norm_before_gate:  # per-group norm then gate: the fused kernel on [..., C/gs, gs], weight afterwards
        shape = (*x.shape[:-1], C // group_size, group_size)
        y = rms_norm_gated(
            x.reshape(shape),
            gate.reshape(shape),
            None,
            None,
            activation="swish" if swish else "sigmoid",
            eps=eps,
        ).reshape(x.shape)
        return y if weight is None else y * weight  # promotes; the caller casts back to x's dtype
    if weight is None:
        weight = x.new_ones(C)
    if swish:
        return rmsnorm_fn(x, weight, None, z=gate, eps=eps, group_size=group_size, norm_before_gate=False)
    return rmsnorm_fn(x * torch.sigmoid(gate), weight, None, eps=eps, group_size=group_size)
