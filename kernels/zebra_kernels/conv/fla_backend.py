"""Depthwise causal conv1d on FLA's Triton kernels (`fla.modules.causal_conv1d`), GPU only.

FLA's cache is `[N, C, W]` in x's dtype; it holds raw inputs, so states in x's dtype or float32 convert both
ways without loss. The final state comes back in x's dtype (the caller casts it to the state dtype it promises).
"""

from __future__ import annotations

import torch


def fla_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    activation: str | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as `zebra_kernels.causal_conv1d`."""
    from fla.modules.causal_conv1d import causal_conv1d, causal_conv1d_update

    if x.dtype == torch.float64:
        x = x.float()
    weight = weight.to(x.dtype)
    bias = None if bias is None else bias.to(x.dtype)
    B, T, C = x.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    one_token_each = B * T == N and (cu_seqlens is None or bool((cu_seqlens.diff() == 1).all()))
    if one_token_each and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        # decode: FLA's update kernel rolls the cache in place, so give it a copy (one, also across dtypes)
        if initial_state is None:
            cache = x.new_zeros(N, C, weight.shape[1])
        else:
            cache = initial_state.to(x.dtype, memory_format=torch.contiguous_format, copy=True)
        y, cache = causal_conv1d_update(x=x, cache=cache, weight=weight, bias=bias, activation=activation)
        return y, cache if output_final_state else None
    state = None if initial_state is None else initial_state.to(x.dtype).contiguous()
    y, final_state = causal_conv1d(
        x=x,
        weight=weight,
        bias=bias,
        initial_state=state,
        output_final_state=output_final_state,
        activation=activation,
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(x.device, torch.long),
    )
    return y, final_state
