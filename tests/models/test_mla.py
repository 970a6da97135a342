"""Multi-Latent Attention: absorbed decode == expanded attention; RoPE/YaRN == Megatron's MLA functions; the
cache holds only kv_lora_rank + qk_rope values per token."""

from __future__ import annotations

import math

import pytest
import torch
from tests.models.tiny import tiny_model

from zebra.models import ZebraCache
from zebra.models.configuration_zebra import YARN_DEFAULTS
from zebra.models.layers.mla import MultiLatentAttention
from zebra.models.layers.rotary import (
    YarnRotaryEmbedding,
    yarn_concentration,
    yarn_inv_freq,
    yarn_softmax_scale,
)
from zebra_kernels.rope import torch_rotate_pairs


def rope(**overrides):
    return {**YARN_DEFAULTS, "rope_theta": 10000.0, "original_max_position_embeddings": 64, **overrides}


def mla_layer(q_lora_rank: int, rope_params: dict, seed: int = 0) -> MultiLatentAttention:
    torch.manual_seed(seed)
    layer = MultiLatentAttention(48, 4, q_lora_rank, 24, 8, 8, 12, rope_params, layer_idx=0).double()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return layer


class OneLayerConfig:
    layer_pattern = "*"
    kv_lora_rank, qk_rope_head_dim = 24, 8


@pytest.mark.parametrize("q_lora_rank", [0, 16])
@pytest.mark.parametrize("factor", [1.0, 4.0])
@torch.no_grad()
def test_absorbed_decode_equals_expanded_attention(q_lora_rank, factor):
    """After a padded prefill, new tokens attend over the latent cache in both forms; same outputs."""
    layer = mla_layer(q_lora_rank, rope(factor=factor, mscale=0.7, mscale_all_dim=0.5))
    B, P, T = 3, 11, 4
    gen = torch.Generator().manual_seed(1)
    prompt, new = torch.randn(B, P, 48, generator=gen).double(), torch.randn(B, T, 48, generator=gen).double()
    mask = torch.ones(B, P + T, dtype=torch.long)
    mask[1, :3] = 0  # left padding in row 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    outs = {}
    for absorb in (False, True):
        cache = ZebraCache(OneLayerConfig())
        layer(prompt, position_ids=positions[:, :P], attention_mask=mask[:, :P], cache=cache, absorb=False)
        cache.advance(P)
        outs[absorb] = layer(
            new, position_ids=positions[:, P:], attention_mask=mask, cache=cache, absorb=absorb
        )
    torch.testing.assert_close(outs[True], outs[False], atol=1e-12, rtol=0)
    # and both equal one expanded pass over the whole sequence (no cache)
    whole = layer(torch.cat([prompt, new], 1), position_ids=positions, attention_mask=mask, absorb=False)
    torch.testing.assert_close(outs[True][[0, 2]], whole[[0, 2], P:], atol=1e-12, rtol=0)
    torch.testing.assert_close(outs[True][1], whole[1, P:], atol=1e-12, rtol=0)


def test_cache_holds_only_the_latent_and_the_rope_key():
    model = tiny_model("tiny")
    cache = ZebraCache(model.config)
    with torch.no_grad():
        model(torch.randint(0, 200, (2, 13)), cache=cache)
    mla = cache.layers[0]
    c = model.config
    assert {k: tuple(v.shape) for k, v in mla.tensors().items()} == {
        "latent": (2, 13, c.kv_lora_rank),
        "k_rope": (2, 13, c.qk_rope_head_dim),
    }


def test_rotary_matches_megatron_mla_convention():
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    T, H, d = 7, 3, 8
    t = torch.randn(T, 1, H, d, dtype=torch.float64)  # Megatron layout [s, b, h, d]
    rope_params = rope(factor=2.0)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * yarn_inv_freq(d, rope_params)  # [T, d/2]
    freqs = torch.cat([angles, angles], dim=-1)[:, None, None, :]  # Megatron emb [s, 1, 1, d]
    mscale = yarn_concentration(rope_params)
    expected = _apply_rotary_pos_emb_bshd(t, freqs, multi_latent_attention=True, mscale=mscale)
    cos, sin = YarnRotaryEmbedding(d, rope_params)(torch.arange(T)[None], torch.float64)  # [1, T, d/2]
    got = torch_rotate_pairs(t.squeeze(1), cos[0][:, None], sin[0][:, None])  # [T, H, d]
    torch.testing.assert_close(got, expected.squeeze(1), atol=1e-12, rtol=0)


@pytest.mark.parametrize("factor", [1.0, 4.0, 40.0])
def test_yarn_frequencies_and_scales_match_megatron(factor):
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        _yarn_find_correction_range,
        _yarn_get_concentration_factor,
        _yarn_get_mscale,
        _yarn_linear_ramp_mask,
    )

    d, base, orig = 64, 10000.0, 4096
    params = rope(
        factor=factor, rope_theta=base, original_max_position_embeddings=orig, mscale=1.0, mscale_all_dim=0.8
    )
    # Megatron YarnRotaryEmbedding.get_emb, written out
    extra = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    low, high = _yarn_find_correction_range(32.0, 1.0, d, base, orig, True)
    keep = 1.0 - _yarn_linear_ramp_mask(low, high, d // 2, device="cpu").double()
    expected = (extra / factor) * (1 - keep) + extra * keep
    torch.testing.assert_close(yarn_inv_freq(d, params), expected, atol=1e-12, rtol=1e-6)
    assert yarn_concentration(params) == pytest.approx(_yarn_get_concentration_factor(factor, 1.0, 0.8))
    # MLASelfAttention: softmax_scale = mscale(factor, mscale_all_dim)^2 / sqrt(q_head_dim)
    expected_scale = _yarn_get_mscale(factor, 0.8) ** 2 / math.sqrt(96)
    assert yarn_softmax_scale(params, 96) == pytest.approx(expected_scale)
    if factor == 1.0:  # plain RoPE
        assert yarn_concentration(params) == 1.0 and yarn_softmax_scale(params, 96) == 1 / math.sqrt(96)
