"""Depthwise causal conv1d, torch reference (W shifted multiply-adds over [state | x]).

The state is FLA's ShortConvolution cache: the last W inputs of the sequence, `[N, C, W]`, oldest first
(column W-1 is the newest input), raw (before the conv and activation). With an initial state the conv reads
its last W - 1 columns as the inputs before t = 0, so a cache from either backend continues a sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def torch_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    initial_state: torch.Tensor | None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Conv of equal-length (or zero-padded, with `lengths`) sequences.

    Args:
        x: `[B, T, C]`. weight: `[C, W]` (column W-1 multiplies the current input). bias: `[C]` or None.
        activation: "silu"/"swish" or None.
        initial_state: `[B, C, W]` or None (zeros).
        lengths: `[B]` true lengths when rows are zero-padded at the end; the final state is taken at each
            row's own end.

    Returns:
        y `[B, T, C]` and the final state `[B, C, W]`, in x's dtype.
    """
    B, T, C = x.shape
    W = weight.shape[1]
    history = x.new_zeros(B, C, W) if initial_state is None else initial_state.to(x.dtype)
    timeline = torch.cat([history, x.transpose(1, 2)], dim=-1)  # [B, C, W + T]: x_t sits at W + t
    # W shifted multiply-adds: far faster on CPU than a grouped F.conv1d for the short widths used here (W <= 8)
    w = weight.to(x.dtype)
    y = sum(timeline[..., 1 + i : 1 + i + T] * w[:, i, None] for i in range(W))  # [B, C, T]
    if bias is not None:
        y = y + bias.to(x.dtype)[:, None]
    if activation in ("silu", "swish"):
        y = F.silu(y)
    if lengths is None:
        final = timeline[..., T:]  # [B, C, W]: inputs T-W .. T-1
    else:
        index = (lengths.to(x.device)[:, None] + torch.arange(W, device=x.device))[:, None, :].expand(B, C, W)
        final = timeline.gather(-1, index)  # [B, C, W]: each row's last W inputs
    return y.transpose(1, 2), final
