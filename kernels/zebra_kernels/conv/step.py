"""One decode token of the causal conv, rolling a static cache's state in place: `causal_conv1d_step_`.

The scan path (`causal_conv1d` with a state) copies the state, lets FLA's update kernel roll the copy, and the
cache then copies it back where its `feed` flag allows: three launches per recurrent sublayer and token. This op
is one (`zebra_kernels.conv.triton_step` on a GPU): it reads the state, writes the rolled window back into the
same buffer (only where `feed` is True) and returns the conv output.
"""

from __future__ import annotations

import torch

from zebra_kernels._common import check_state, compute_dtype, store_state_
from zebra_kernels.backend import resolve_backend
from zebra_kernels.conv.naive import torch_causal_conv1d


def causal_conv1d_step_(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    state: torch.Tensor,
    feed: torch.Tensor | None = None,
    activation: str | None = "silu",
    backend: str = "auto",
) -> torch.Tensor:
    """`causal_conv1d` for one token per row, updating `state` in place.

    Args:
        x: `[B, C]`, this token's inputs (a strided view is fine).
        weight: `[C, W]`. bias: `[C]` or None. activation: "silu" (= "swish") or None.
        state: `[B, C, W]`, the last W inputs, oldest first: rolled left and x appended, in place.
        feed: a 0-d bool tensor: False leaves `state` as it was (a static `ZebraCache`'s flag); None = True.
        backend: "torch", or "auto" / "fla" / "mamba_ssm": one Triton launch on a GPU (torch elsewhere for "auto").

    Returns:
        y `[B, C]` in x's dtype.
    """
    B, C = x.shape
    check_state(state, (B, C, weight.shape[1]), name="state")
    dtype = compute_dtype(x, weight, bias, state)
    if dtype == torch.float32 and resolve_backend(backend, x.device) != "torch":
        from zebra_kernels.conv.triton_step import triton_conv_step_

        return triton_conv_step_(x, weight, bias, state=state, feed=feed, activation=activation)
    y, window = torch_causal_conv1d(x.to(dtype)[:, None], weight, bias, activation, state)  # [B, 1, C]
    store_state_(state, window, feed)
    return y[:, 0].to(x.dtype)
