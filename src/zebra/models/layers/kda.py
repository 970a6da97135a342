"""Kimi Delta Attention (KDA), the `K` sublayer: FLA `KimiDeltaAttention` parameterisation."""

from __future__ import annotations

import torch
from torch import nn

from zebra.models.layers.norm import GatedRMSNorm
from zebra.models.layers.recurrent import DeltaRuleMixer
from zebra_kernels import kda_gate, kimi_delta_rule


class KimiDeltaAttention(DeltaRuleMixer):
    """Kimi Delta Attention mixer: a delta rule with a per-channel decay.

    Reference: `Kimi Linear: An Expressive, Efficient Attention Architecture <https://arxiv.org/abs/2510.26692>`_;
    the forward math is FLA 0.6.0's `fla.layers.KimiDeltaAttention` (use_short_conv=True, one head count for q/k and v).

    Per token (H heads, K key channels, V value channels):
        q, k, v = SiLU(causal depthwise conv(q_proj x, k_proj x, v_proj x))        (conv width W, no bias)
        g       = -exp(A_log[h]) * softplus(f_proj x + dt_bias)   log decay per channel, f_proj: D -> V -> H*K
        beta    = sigmoid(b_proj x)                                                           [H]
        S_t     = (I - beta k k^T) Diag(exp(g)) S_{t-1} + beta k v^T,  o = S_t^T (q / sqrt(K)), q, k L2-normalised
        out     = o_proj(RMSNorm(o) * weight * sigmoid(g_proj x)),   g_proj: D -> V -> H*V (bias: gate_bias)

    Parameters: D*(2*H*K + H*V) + (D*V + V*H*K) + D*H + (D*V + V*H*V + H*V) + H*V*D + (2*H*K + H*V)*W + H + H*K + V
    (1B, D=2048, H=16, K=32, V=64: q/k/v 4.19M + o 2.10M + f/g/b 0.39M + conv/A/dt/norm 0.01M = 6,694,480);
    without the gate bias, H*V fewer (Kimi-Linear's form, which also has K == V).

    Args:
        hidden_size: model width D.
        num_heads: heads H.
        head_dim: query/key channels K.
        head_v_dim: value channels V.
        conv_size: short convolution width W.
        allow_neg_eigval: beta in (0, 2) instead of (0, 1).
        norm_eps: epsilon of the gated output norm.
        gate_bias: a bias on the output gate's second factor (FLA's form; Kimi-Linear's has none).
        layer_idx: the sublayer index (its slot in the cache).
        backend: kernel backend ("auto", "torch", "fla").
    """

    kernel = staticmethod(kimi_delta_rule)
    projections = ("q_proj", "k_proj", "v_proj", "b_proj", "f_proj.0", "g_proj.0")
    gate = staticmethod(kda_gate)
    a_low = 1.0

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
        gate_bias: bool = True,
    ):
        super().__init__(layer_idx, backend)
        self.num_heads, self.head_dim, self.head_v_dim = num_heads, head_dim, head_v_dim
        self.value_heads = num_heads  # one head count: each head has its own q/k and v
        self.allow_neg_eigval = allow_neg_eigval
        self.key_dim, self.value_dim = num_heads * head_dim, num_heads * head_v_dim
        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.add_qkv_convs(conv_size)
        self.f_proj = nn.Sequential(
            nn.Linear(hidden_size, head_v_dim, bias=False),
            nn.Linear(head_v_dim, self.key_dim, bias=False),
        )
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(num_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(self.key_dim))
        self.A_log._no_weight_decay = True
        self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Sequential(
            nn.Linear(hidden_size, head_v_dim, bias=False),
            nn.Linear(head_v_dim, self.value_dim, bias=gate_bias),
        )
        self.o_norm = GatedRMSNorm(head_v_dim, eps=norm_eps, activation="sigmoid", backend=backend)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.o_proj._is_residual_out = True
        self.reset_parameters()

    def raw_decay(self, projected: dict[str, torch.Tensor]) -> torch.Tensor:
        low_rank = projected["f_proj.0"]  # [B, T, V]
        return self.f_proj[1](low_rank).unflatten(-1, (self.num_heads, self.head_dim))  # [B, T, H, K]

    def output_gate(self, projected: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.g_proj[1](projected["g_proj.0"])  # [B, T, H * V]
