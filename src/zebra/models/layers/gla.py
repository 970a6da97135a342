"""Gated Linear Attention (GLA), the `L` sublayer: FLA `GatedLinearAttention` parameterisation."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from zebra.models.layers.norm import GatedRMSNorm
from zebra.models.layers.packed import project
from zebra.models.layers.recurrent import QKVConvMixer, float32_or_64, zero_padding
from zebra_kernels.gla import gated_linear_attention


class GatedLinearAttention(QKVConvMixer):
    """Gated linear attention: linear attention whose state decays per key channel, by a data-dependent gate.

    Reference: `Gated Linear Attention Transformers with Hardware-Efficient Training
    <https://arxiv.org/abs/2312.06635>`_; the forward math is FLA 0.6.0's `fla.layers.GatedLinearAttention` with
    use_short_conv=True, one key/value head per query head, no feature map, the swish output gate fused with the
    norm (FLA's defaults otherwise).

    Per token (H heads, K key channels, V value channels, gate rank R):
        q, k, v = SiLU(causal depthwise conv(q_proj x, k_proj x, v_proj x))        (conv width W, no bias)
        g       = logsigmoid(gk_proj x) / gate_logit_normalizer     log decay per channel, gk_proj: D -> R -> H*K
        S_t     = Diag(exp(g)) S_{t-1} + k v^T,   o = S_t^T (q / sqrt(K))
        out     = o_proj(RMSNorm(o) * weight * SiLU(g_proj x))       (norm per head)
    Pad tokens get k = 0 and g = 0: the state passes them unchanged.

    Parameters: D*(2*H*K + 2*H*V) + D*R + R*H*K + H*K + H*V*D + (2*H*K + H*V)*W + V
    (1B, D=2048, H=16, K=64, V=128, R=16: q/k 4.19M + v/g 8.39M + o 4.19M + gate/conv/norm 0.07M = 16,843,904).

    Args:
        hidden_size: model width D.
        num_heads: heads H.
        head_dim: query/key channels K.
        head_v_dim: value channels V.
        conv_size: short convolution width W.
        gate_low_rank_dim: rank R of the decay projection.
        gate_logit_normalizer: divides the decay's logsigmoid (FLA's 16: decays start near 1).
        norm_eps: epsilon of the gated output norm.
        layer_idx: the sublayer index (its slot in the cache).
        backend: kernel backend ("auto", "torch", "fla").
    """

    projections = ("q_proj", "k_proj", "v_proj", "g_proj", "gk_proj.0")  # bias-free linears of the input

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        head_v_dim: int,
        conv_size: int = 4,
        gate_low_rank_dim: int = 16,
        gate_logit_normalizer: float = 16.0,
        norm_eps: float = 1e-6,
        layer_idx: int | None = None,
        backend: str = "auto",
    ):
        super().__init__(layer_idx, backend)
        self.num_heads, self.head_dim, self.head_v_dim = num_heads, head_dim, head_v_dim
        self.gate_logit_normalizer = gate_logit_normalizer
        self.key_dim, self.value_dim = num_heads * head_dim, num_heads * head_v_dim
        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.add_qkv_convs(conv_size)
        self.gk_proj = nn.Sequential(
            nn.Linear(hidden_size, gate_low_rank_dim, bias=False),
            nn.Linear(gate_low_rank_dim, self.key_dim, bias=True),
        )
        self.g_norm_swish_gate = GatedRMSNorm(head_v_dim, eps=norm_eps, activation="swish", backend=backend)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.o_proj._is_residual_out = True
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Nothing of its own (as FLA's layer): the projections, convs and norm keep their own (or the model's)
        initialisation, so the decay starts at logsigmoid(~0) / 16 per token."""

    def mix(self, hidden_states, state, conv_state, context):
        B, T, _ = hidden_states.shape
        H, K, V = self.num_heads, self.head_dim, self.head_v_dim
        qkv, gate, low_rank = project(
            self, hidden_states, self.projections, joined=3
        )  # [B, T, 2HK + HV], ...
        qkv, conv_state = self.short_conv(qkv, self.conv_weight(), None, conv_state, context)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        g = F.logsigmoid(float32_or_64(self.gk_proj[1](low_rank))) / self.gate_logit_normalizer  # [B, T, H*K]
        k, g = zero_padding(k, context.mask), zero_padding(g, context.mask)  # pads: no write, no decay
        o, state = gated_linear_attention(
            q.view(B, T, H, K),
            k.view(B, T, H, K),
            v.view(B, T, H, V),
            g.view(B, T, H, K),
            initial_state=state,
            output_final_state=context.output_final_state,
            cu_seqlens=context.cu_seqlens,
            backend=self.backend,
        )  # [B, T, H, V]
        o = self.g_norm_swish_gate(o, gate.view(B, T, H, V))
        return self.o_proj(o.reshape(B, T, H * V)), state, conv_state
