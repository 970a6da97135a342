"""Depthwise causal conv1d with a decode cache: `causal_conv1d` (FLA ShortConvolution / Mamba2 conv)."""

from __future__ import annotations

import torch

from zebra_kernels._common import check_state, compute_dtype, num_sequences, pack, unpack
from zebra_kernels.backend import resolve_backend
from zebra_kernels.conv.naive import torch_causal_conv1d
from zebra_kernels.conv.step import causal_conv1d_step_

__all__ = ["causal_conv1d", "causal_conv1d_step_", "torch_causal_conv1d"]

ACTIVATIONS = ("silu", "swish", None)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""Depthwise causal 1-D convolution, `y_t = act(sum_w weight[:, w] x_{t-W+1+w} + bias)`.

    The state is FLA's ShortConvolution cache layout: the last W raw inputs, `[N, C, W]`, oldest first, so
    a state from either backend (or from FLA's layers) continues the sequence on the other.

    Args:
        x: `[B, T, C]`.
        weight: `[C, W]` (an `nn.Conv1d` depthwise weight `[C, 1, W]` squeezed); column W-1 multiplies x_t.
        bias: `[C]` or None.
        activation: "silu" (= "swish") or None.
        initial_state: `[N, C, W]` (N = B, or the number of packed sequences); None means zeros before t = 0.
        output_final_state: also return the final state `[N, C, W]`.
        cu_seqlens: `[N + 1]` int offsets of packed sequences (then B == 1); the conv never reads across a
            sequence boundary.
        backend: "auto", "torch" or "fla" (see `resolve_backend`).

    Returns:
        y `[B, T, C]` in x's dtype, and the final state `[N, C, W]` or None. The state holds raw inputs, so it
        keeps the initial state's dtype (promoted with x's: a bf16 cache for bf16 inputs stays bf16, with no
        cast in a decode step); without an initial state it is float32 (float64 for float64 inputs).

    Examples:
        >>> x, weight = torch.randn(2, 10, 8), torch.randn(8, 4)
        >>> y, state = causal_conv1d(x, weight, output_final_state=True)
        >>> y_next, state = causal_conv1d(torch.randn(2, 1, 8), weight, initial_state=state, output_final_state=True)
        >>> y.shape, state.shape
        (torch.Size([2, 10, 8]), torch.Size([2, 8, 4]))
    """
    if x.dim() != 3:
        raise ValueError(f"x must have shape [B, T, C], got {list(x.shape)}")
    C = x.shape[2]
    if weight.dim() != 2 or weight.shape[0] != C:
        raise ValueError(f"weight must have shape [C, W] with C={C}, got {list(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"bias must have shape [C] = [{C}], got {list(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    N = num_sequences(x, cu_seqlens)
    check_state(initial_state, (N, C, weight.shape[1]))
    out_dtype, dtype = x.dtype, compute_dtype(x, weight, bias, initial_state)
    state_dtype = dtype if initial_state is None else torch.promote_types(initial_state.dtype, x.dtype)

    if resolve_backend(backend, x.device) == "fla":
        from zebra_kernels.conv.fla_backend import fla_causal_conv1d

        y, state = fla_causal_conv1d(
            x,
            weight,
            bias,
            activation=activation,
            initial_state=initial_state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
        )
        return y.to(out_dtype), (None if state is None else state.to(state_dtype))

    if cu_seqlens is None:
        y, state = torch_causal_conv1d(x.to(dtype), weight, bias, activation, initial_state)
    else:
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        y, state = torch_causal_conv1d(
            unpack(x.to(dtype), cu_seqlens), weight, bias, activation, initial_state, lengths
        )
        y = pack(y, cu_seqlens)
    return y.to(out_dtype), (state.to(state_dtype) if output_final_state else None)
