"""Rotary embedding of de-interleaved output, in plain torch: the reference of the fused kernel and the CPU path."""

from __future__ import annotations

import torch


def torch_rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of `x [..., d]` by angle i; output de-interleaved `[x_even' | x_odd']`.

    cos, sin broadcast against `x[..., : d / 2]` (e.g. `[B, T, 1, d / 2]` for `x [B, T, H, d]`).
    """
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # [..., d / 2] each
    return torch.cat((x_even * cos - x_odd * sin, x_odd * cos + x_even * sin), dim=-1)
