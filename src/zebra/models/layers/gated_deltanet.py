"""Gated DeltaNet (GDN), the `G` sublayer: FLA `GatedDeltaNet` parameterisation."""

from __future__ import annotations

import torch
from torch import nn

from zebra.models.layers.norm import GatedRMSNorm
from zebra.models.layers.recurrent import DeltaRuleMixer
from zebra_kernels import gated_delta_rule, gdn_gate


class GatedDeltaNet(DeltaRuleMixer):
    """Gated DeltaNet mixer with grouped value heads.

    Reference: `Gated Delta Networks: Improving Mamba2 with Delta Rule <https://arxiv.org/abs/2412.06464>`_;
    the forward math is FLA 0.6.0's `fla.layers.GatedDeltaNet` (use_gate=True, use_short_conv=True).

    Per token (H key heads of K channels, HV value heads of V channels, HV a multiple of H):
        q, k, v = SiLU(causal depthwise conv(q_proj x, k_proj x, v_proj x))        (conv width W, no bias)
        beta    = sigmoid(b_proj x)              (2 * sigmoid with allow_neg_eigval)          [HV]
        g       = -exp(A_log) * softplus(a_proj x + dt_bias)  (log decay)                      [HV]
        S_t     = exp(g) (I - beta k k^T) S_{t-1} + beta k v^T,  o = S_t^T (q / sqrt(K)), q, k L2-normalised
        out     = o_proj(RMSNorm(o) * weight * SiLU(g_proj x))       (norm per value head)

    Parameters: D*(2*H*K + 2*HV*V + 2*HV) + HV*V*D + (2*H*K + HV*V)*W + 2*HV + V
    (1B, D=2048, H=8, K=64, HV=16, V=64: q/k 2.1M + v/g 4.2M + o 2.1M + a/b/conv/norm 0.07M = 8,462,432).

    Args:
        hidden_size: model width D.
        num_heads: query/key heads H.
        head_dim: query/key channels K.
        num_v_heads: value heads HV (a multiple of H).
        head_v_dim: value channels V.
        conv_size: short convolution width W.
        allow_neg_eigval: beta in (0, 2) instead of (0, 1).
        norm_eps: epsilon of the gated output norm.
        layer_idx: the sublayer index (its slot in the cache).
        backend: kernel backend ("auto", "torch", "fla").
    """

    kernel = staticmethod(gated_delta_rule)
    gate = staticmethod(gdn_gate)
    a_low = 0.0
    projections = ("q_proj", "k_proj", "v_proj", "b_proj", "a_proj", "g_proj")

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        num_v_heads: int,
        head_v_dim: int,
        conv_size: int = 4,
        allow_neg_eigval: bool = False,
        norm_eps: float = 1e-6,
        layer_idx: int | None = None,
        backend: str = "auto",
    ):
        super().__init__(layer_idx, backend)
        if num_v_heads % num_heads:
            raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, head_dim
        self.value_heads, self.head_v_dim = num_v_heads, head_v_dim
        self.allow_neg_eigval = allow_neg_eigval
        self.key_dim, self.value_dim = num_heads * head_dim, num_v_heads * head_v_dim
        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.a_proj = nn.Linear(hidden_size, num_v_heads, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_v_heads, bias=False)
        self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.add_qkv_convs(conv_size)
        self.A_log = nn.Parameter(torch.empty(num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(num_v_heads))
        self.A_log._no_weight_decay = True
        self.dt_bias._no_weight_decay = True
        self.o_norm = GatedRMSNorm(head_v_dim, eps=norm_eps, activation="swish", backend=backend)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.o_proj._is_residual_out = True
        self.reset_parameters()

    def raw_decay(self, projected: dict[str, torch.Tensor]) -> torch.Tensor:
        return projected["a_proj"]  # [B, T, HV]

    def output_gate(self, projected: dict[str, torch.Tensor]) -> torch.Tensor:
        return projected["g_proj"]  # [B, T, HV * V]
