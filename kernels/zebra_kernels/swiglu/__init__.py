"""SwiGLU followed by the down projection: `swiglu_linear` (the `-` sublayer's MLP after its two up projections).

On a GPU (every backend but torch; not inside torch.compile, which fuses it itself) it is `zebra_kernels.swiglu.triton_fused`, FLA's `swiglu_linear` with our own
kernels: one Triton kernel for `silu(gate) * up`, the matmul, and a backward that recomputes the product
instead of keeping it (saves `[N, F]` of activations per MLP).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zebra_kernels.backend import resolve_fusible_backend


def swiglu_linear(
    gate: torch.Tensor,
    up: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    r"""`F.linear(silu(gate) * up, weight, bias)`.

    Args:
        gate: `[..., F]` (the gate projection's output).
        up: `[..., F]` (the up projection's output).
        weight: `[D, F]` (the down projection).
        bias: `[D]` or None.
        backend: "auto", "torch" or "fla" (see `resolve_backend`).

    Returns:
        `[..., D]`; under autocast in the autocast dtype, like `F.linear`.

    Examples:
        >>> g, u, w = torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(4, 8)
        >>> swiglu_linear(g, u, w).shape
        torch.Size([2, 5, 4])
    """
    if gate.shape != up.shape:
        raise ValueError(f"up must have gate's shape {list(gate.shape)}, got {list(up.shape)}")
    if weight.dim() != 2 or weight.shape[1] != gate.shape[-1]:
        raise ValueError(f"weight must have shape [D, {gate.shape[-1]}], got {list(weight.shape)}")
    if resolve_fusible_backend(backend, gate.device) == "fla" and gate.dtype != torch.float64:
        from zebra_kernels.swiglu.triton_fused import triton_swiglu_linear

        return triton_swiglu_linear(gate, up, weight, bias)
    return F.linear(F.silu(gate) * up, weight, bias)
