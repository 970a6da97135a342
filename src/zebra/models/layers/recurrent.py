"""Pieces shared by the recurrent mixers (Mamba2, GDN, KDA): padding masks and decay-parameter initialisation.

Padding: a pad token must leave the recurrent state untouched, so that a left-padded sequence gives the same
output as the unpadded one. The mixers zero the conv inputs of pad tokens (a causal conv then sees zeros, exactly
as before the first token) and give pads a no-op update (log decay g = 0, beta = 0 for the delta rules; dt = 0
for SSD). Exact for left padding and for padding inside a sequence; the conv state after trailing (right)
padding would hold zeros, so generate with left padding.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def current_token_mask(attention_mask: torch.Tensor | None, T: int) -> torch.Tensor | None:
    """The `[B, T]` bool mask of the new tokens from an HF mask `[B, L]` over cached + new tokens (last T)."""
    if attention_mask is None:
        return None
    return attention_mask[:, -T:].to(torch.bool)


def zero_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`x [B, T, ...]` with pad positions (mask False) set to 0 (NaN-safe, unlike multiplying)."""
    if mask is None:
        return x
    return x.masked_fill(~mask.view(*mask.shape, *([1] * (x.dim() - 2))), 0)


def float32_or_64(x: torch.Tensor) -> torch.Tensor:
    """x in float32 (float64 stays float64): where the mixers compute gates and step sizes."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def log_uniform_a(n: int, low: float, high: float) -> torch.Tensor:
    """A_log init: `log(A)` with A ~ U(low, high), float32 `[n]` (FLA GDN: U(0, 16); FLA KDA, Megatron: U(1, 16))."""
    return torch.empty(n, dtype=torch.float32).uniform_(low, high).log()


def inverse_softplus_dt(
    n: int, dt_min: float = 1e-3, dt_max: float = 0.1, floor: float = 1e-4
) -> torch.Tensor:
    """dt_bias init `[n]`: dt log-uniform in [dt_min, dt_max], floored, stored as its inverse softplus
    (so `softplus(dt_bias) == dt`), as FLA and Megatron."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


def depthwise_conv(channels: int, width: int, bias: bool = False) -> nn.Conv1d:
    """A depthwise `nn.Conv1d` that holds the short-conv weight `[C, 1, W]` (and bias `[C]`); the kernel
    (`zebra_kernels.causal_conv1d`) runs the convolution, so the module itself is never called."""
    return nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1, bias=bias)
