"""Kimi Delta Attention (KDA), the `K` sublayer: FLA `KimiDeltaAttention` parameterisation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from zebra.models.layers.norm import GatedRMSNorm
from zebra.models.layers.recurrent import (
    current_token_mask,
    depthwise_conv,
    float32_or_64,
    inverse_softplus_dt,
    log_uniform_a,
    zero_padding,
)
from zebra_kernels import causal_conv1d, kda_gate, kimi_delta_rule

if TYPE_CHECKING:
    from zebra.models.cache_zebra import ZebraCache


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention mixer: a delta rule with a per-channel decay.

    Reference: `Kimi Linear: An Expressive, Efficient Attention Architecture <https://arxiv.org/abs/2510.26692>`_;
    the forward math is FLA 0.6.0's `fla.layers.KimiDeltaAttention` (use_short_conv=True, num_v_heads = num_heads).

    Per token (H heads, K key channels, V value channels):
        q, k, v = SiLU(causal depthwise conv(q_proj x, k_proj x, v_proj x))        (conv width W, no bias)
        g       = -exp(A_log[h]) * softplus(f_proj x + dt_bias)   log decay per channel, f_proj: D -> V -> H*K
        beta    = sigmoid(b_proj x)                                                           [H]
        S_t     = (I - beta k k^T) Diag(exp(g)) S_{t-1} + beta k v^T,  o = S_t^T (q / sqrt(K)), q, k L2-normalised
        out     = o_proj(RMSNorm(o) * weight * sigmoid(g_proj x)),   g_proj: D -> V -> H*V (with bias)

    Parameters: D*(2*H*K + H*V) + (D*V + V*H*K) + D*H + (D*V + V*H*V + H*V) + H*V*D + (2*H*K + H*V)*W + H + H*K + V
    (1B, D=2048, H=16, K=32, V=64: q/k/v 4.19M + o 2.10M + f/g/b 0.39M + conv/A/dt/norm 0.01M = 6,694,480).

    Args:
        hidden_size: model width D.
        num_heads: heads H.
        head_dim: query/key channels K.
        head_v_dim: value channels V.
        conv_size: short convolution width W.
        allow_neg_eigval: beta in (0, 2) instead of (0, 1).
        norm_eps: epsilon of the gated output norm.
        layer_idx: the sublayer index (its slot in the cache).
        backend: kernel backend ("auto", "torch", "fla").
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        head_v_dim: int,
        conv_size: int = 4,
        allow_neg_eigval: bool = False,
        norm_eps: float = 1e-6,
        layer_idx: int | None = None,
        backend: str = "auto",
    ):
        super().__init__()
        self.num_heads, self.head_dim, self.head_v_dim = num_heads, head_dim, head_v_dim
        self.allow_neg_eigval = allow_neg_eigval
        self.layer_idx = layer_idx
        self.backend = backend
        self.key_dim, self.value_dim = num_heads * head_dim, num_heads * head_v_dim
        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.q_conv1d = depthwise_conv(self.key_dim, conv_size)
        self.k_conv1d = depthwise_conv(self.key_dim, conv_size)
        self.v_conv1d = depthwise_conv(self.value_dim, conv_size)
        self.f_proj = nn.Sequential(
            nn.Linear(hidden_size, head_v_dim, bias=False),
            nn.Linear(head_v_dim, self.key_dim, bias=False),
        )
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.A_log = nn.Parameter(log_uniform_a(num_heads, 1.0, 16.0))
        self.dt_bias = nn.Parameter(inverse_softplus_dt(self.key_dim))
        self.A_log._no_weight_decay = True
        self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Sequential(
            nn.Linear(hidden_size, head_v_dim, bias=False),
            nn.Linear(head_v_dim, self.value_dim, bias=True),
        )
        self.o_norm = GatedRMSNorm(head_v_dim, eps=norm_eps, activation="sigmoid", backend=backend)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.o_proj._is_residual_out = True

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        cache: ZebraCache | None = None,
        cu_seqlens: torch.Tensor | None = None,
        **unused,
    ) -> torch.Tensor:
        """`[B, T, D] -> [B, T, D]`; reads and updates this sublayer's states in `cache`.

        Args:
            hidden_states: `[B, T, D]`.
            attention_mask: `[B, L]` (HF, over cached + new tokens); pad tokens leave the state unchanged.
            cache: the model's `ZebraCache`, or None.
            cu_seqlens: `[N + 1]` packed-sequence offsets (B == 1).
        """
        B, T, _ = hidden_states.shape
        H, K, V = self.num_heads, self.head_dim, self.head_v_dim
        mask = current_token_mask(attention_mask, T)  # [B, T] or None
        state, conv_state = cache.recurrent_state(self.layer_idx) if cache is not None else (None, None)

        qkv = torch.cat(
            [self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)], -1
        )
        weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight]).squeeze(
            1
        )  # [C, W]
        qkv, conv_state = causal_conv1d(
            zero_padding(qkv, mask),
            weight,
            activation="silu",
            initial_state=conv_state,
            output_final_state=cache is not None,
            cu_seqlens=cu_seqlens,
            backend=self.backend,
        )  # [B, T, 2*H*K + H*V]
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)

        beta = float32_or_64(self.b_proj(hidden_states)).sigmoid()  # [B, T, H]
        if self.allow_neg_eigval:
            beta = beta * 2.0
        f = self.f_proj(hidden_states).view(B, T, H, K)
        if mask is None:  # the gate is fused into the kernel
            g, gate_kwargs = f, {"use_gate_in_kernel": True, "A_log": self.A_log, "dt_bias": self.dt_bias}
        else:
            g, gate_kwargs = zero_padding(kda_gate(f, self.A_log, self.dt_bias), mask), {}
            beta = zero_padding(beta, mask)
        o, state = kimi_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            initial_state=state,
            output_final_state=cache is not None,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm=True,
            backend=self.backend,
            **gate_kwargs,
        )  # [B, T, H, V]
        if cache is not None:
            cache.update_recurrent(self.layer_idx, state, conv_state)

        o = self.o_norm(o, self.g_proj(hidden_states).view(B, T, H, V))
        return self.o_proj(o.reshape(B, T, H * V))
