"""RMSNorm: `rms_norm` (the sublayer pre-norms, with the residual add fused in, and MLA's latent norms) and
`rms_norm_gated` (GDN/KDA output norm and Mamba2's grouped gated norm)."""

from __future__ import annotations

import torch

from zebra_kernels._common import compute_dtype
from zebra_kernels.backend import as_fla_float, resolve_backend, resolve_fusible_backend
from zebra_kernels.norm.naive import torch_rms_norm, torch_rms_norm_gated

__all__ = ["rms_norm", "rms_norm_gated", "torch_rms_norm", "torch_rms_norm_gated"]

ACTIVATIONS = ("swish", "silu", "sigmoid")


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    *,
    eps: float,
    residual: torch.Tensor | None = None,
    prenorm: bool = False,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    r"""RMSNorm over the last dim, with an optional residual add fused in (on a GPU, `norm.triton_fused`).

    `s = x + residual` (or `x`), `y = weight * s / sqrt(mean(s^2) + eps)`, computed in float32 (float64 for
    float64 inputs) and returned in x's dtype; the sum `s` is kept in residual's dtype. A pre-norm residual
    stack passes each mixer's output as x and the running stream as residual, so one kernel does the add and
    the norm: `h, stream = rms_norm(mixer_out, w, eps=eps, residual=stream, prenorm=True)`.

    Args:
        x: `[..., C]`.
        weight: `[C]` or None.
        eps: added to the mean square.
        residual: `[..., C]` added to x before the norm, or None.
        prenorm: also return the sum `s` (x itself when residual is None).
        backend: "auto", "torch" or "fla" (see `resolve_backend`).

    Returns:
        y `[..., C]`, or `(y, s)` with `prenorm`.

    Examples:
        >>> x, r = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
        >>> y, s = rms_norm(x, torch.ones(16), eps=1e-6, residual=r, prenorm=True)
        >>> torch.allclose(s, x + r)
        True
    """
    C = x.shape[-1]
    if weight is not None and tuple(weight.shape) != (C,):
        raise ValueError(f"weight must have shape [C] = [{C}], got {list(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {list(x.shape)}, got {list(residual.shape)}")
    if (
        resolve_fusible_backend(backend, x.device) == "fla"
    ):  # our Triton kernels (FLA's backward idles the GPU)
        from zebra_kernels.norm.triton_fused import triton_rms_norm

        y, s = triton_rms_norm(
            as_fla_float(x), as_fla_float(weight), eps=eps, residual=as_fla_float(residual)
        )
        y = y.to(x.dtype)
        s = x if residual is None else s.to(residual.dtype)
    else:
        y, s = torch_rms_norm(x, weight, eps, residual, compute_dtype(x, weight, residual))
    return (y, s) if prenorm else y


def rms_norm_gated(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None,
    *,
    eps: float,
    activation: str = "swish",
    norm_before_gate: bool = True,
    group_size: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    r"""Gated RMSNorm over the last dim.

    - `norm_before_gate=True` (FLA FusedRMSNormGated, GDN/KDA `o_norm`): `y = rmsnorm(x) * weight * act(gate)`.
    - `norm_before_gate=False` (Mamba2/Megatron): `y = rmsnorm(x * act(gate)) * weight`.
    With `group_size`, the RMS is taken over each block of `group_size` channels separately (Mamba2 uses
    `d_inner / n_groups`). `rmsnorm(z) = z / sqrt(mean(z^2) + eps)`.

    Args:
        x: `[..., C]`.
        gate: `[..., C]`.
        weight: `[C]` or None.
        eps: added to the mean square.
        activation: "swish" (= "silu", GDN, Mamba2) or "sigmoid" (KDA).
        norm_before_gate: see above.
        group_size: channels per normalisation group (C divisible by it); None means one group.
        backend: "auto", "torch" or "fla" (see `resolve_backend`).

    Returns:
        y `[..., C]` in x's dtype (computed in float32, float64 for float64 inputs).

    Examples:
        >>> x, gate = torch.randn(2, 5, 4, 16), torch.randn(2, 5, 4, 16)
        >>> rms_norm_gated(x, gate, torch.ones(16), eps=1e-6).shape
        torch.Size([2, 5, 4, 16])
    """
    C = x.shape[-1]
    if gate.shape != x.shape:
        raise ValueError(f"gate must have x's shape {list(x.shape)}, got {list(gate.shape)}")
    if weight is not None and tuple(weight.shape) != (C,):
        raise ValueError(f"weight must have shape [C] = [{C}], got {list(weight.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if group_size is not None and (group_size <= 0 or C % group_size != 0):
        raise ValueError(f"group_size must divide C={C}, got {group_size}")

    if resolve_backend(backend, x.device) == "fla":
        from zebra_kernels.norm.fla_backend import fla_rms_norm_gated

        y = fla_rms_norm_gated(
            x,
            gate,
            weight,
            eps=eps,
            activation=activation,
            norm_before_gate=norm_before_gate,
            group_size=group_size,
        )
        return y.to(x.dtype)
    dtype = compute_dtype(x, gate, weight)
    y = torch_rms_norm_gated(
        x.to(dtype),
        gate.to(dtype),
        None if weight is None else weight.to(dtype),
        eps,
        activation,
        norm_before_gate,
        group_size,
    )
    return y.to(x.dtype)
