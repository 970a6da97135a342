"""Rotary position embedding with YaRN scaling, in Megatron's Multi-Latent Attention convention.

YaRN (https://arxiv.org/abs/2309.00071) blends interpolated and original frequencies per channel pair and
multiplies cos/sin by a concentration factor; with `factor == 1.0` it is plain RoPE. The formulas follow
Megatron's `YarnRotaryEmbedding` and DeepSeek-V2: frequencies `theta^(-2i/d)`, correction range from
`beta_fast`/`beta_slow` rounded outwards, cos/sin scaled by `mscale(factor, mscale) / mscale(factor, mscale_all_dim)`
and the attention softmax scale multiplied by `mscale(factor, mscale_all_dim)^2`.

MLA convention (Megatron `_apply_rotary_pos_emb_bshd(multi_latent_attention=True)`): channels (2i, 2i+1) rotate
together with frequency i; the result is laid out de-interleaved, `[rotated evens | rotated odds]`. Queries and
keys use the same layout, so their dot products equal those of the interleaved rotation. The rotation itself is
`zebra_kernels.rope` (`rope_qk`; its torch form `torch_rotate_pairs`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention scaling `0.1 * mscale * ln(scale) + 1` (1.0 for scale <= 1), Megatron `_yarn_get_mscale`."""
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_concentration(rope: dict[str, Any]) -> float:
    """The factor multiplying cos and sin: `mscale(f, mscale) / mscale(f, mscale_all_dim)`."""
    f = rope["factor"]
    return yarn_get_mscale(f, rope["mscale"]) / yarn_get_mscale(f, rope["mscale_all_dim"])


def yarn_softmax_scale(rope: dict[str, Any], head_dim: int) -> float:
    """MLA softmax scale `mscale(f, mscale_all_dim)^2 / sqrt(head_dim)`, head_dim = qk_nope + qk_rope."""
    m = yarn_get_mscale(rope["factor"], rope["mscale_all_dim"])
    return m * m / math.sqrt(head_dim)


def _correction_dim(num_rotations: float, dim: int, base: float, max_positions: int) -> float:
    return (dim * math.log(max_positions / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_inv_freq(dim: int, rope: dict[str, Any], device: torch.device | None = None) -> torch.Tensor:
    """Per-pair inverse frequencies `[dim / 2]` (float64): original ones for fast-rotating pairs, divided by
    `factor` for slow ones, linearly blended in between (Megatron `YarnRotaryEmbedding.get_emb`)."""
    base, factor = float(rope["rope_theta"]), float(rope["factor"])
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim  # [dim / 2]
    extra = torch.pow(torch.full_like(exponents, base), -exponents)
    if factor == 1.0:
        return extra
    max_pos = rope["original_max_position_embeddings"]
    low = math.floor(_correction_dim(rope["beta_fast"], dim, base, max_pos))
    high = math.ceil(_correction_dim(rope["beta_slow"], dim, base, max_pos))
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as Megatron: avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1 where the original frequency is kept
    return (extra / factor) * (1.0 - keep) + extra * keep


class YarnRotaryEmbedding(nn.Module):
    """cos/sin tables for positions, with YaRN scaling; no parameters and no buffers (so `.to(bf16)` cannot
    round the frequencies: they are rebuilt in float64 on each device once and kept outside the state dict).

    Args:
        dim: rotary channels (qk_rope_head_dim), even.
        rope: the config's `rope_parameters` (rope_theta, factor, original_max_position_embeddings, beta_fast,
            beta_slow, mscale, mscale_all_dim).
    """

    def __init__(self, dim: int, rope: dict[str, Any]):
        super().__init__()
        self.dim = dim
        self.rope = dict(rope)
        self.concentration = yarn_concentration(self.rope)
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            self._inv_freq[device] = yarn_inv_freq(self.dim, self.rope, device=device)
        return self._inv_freq[device]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions `[B, T]` -> cos, sin `[B, T, dim / 2]` in `dtype` (angles in float32, float64 for float64)."""
        angle_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        inv_freq = self.inv_freq(positions.device).to(angle_dtype)
        angles = positions.to(angle_dtype)[..., None] * inv_freq  # [B, T, dim / 2]
        cos, sin = angles.cos() * self.concentration, angles.sin() * self.concentration
        return cos.to(dtype), sin.to(dtype)
