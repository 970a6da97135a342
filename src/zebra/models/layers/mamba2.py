"""Mamba2, the `M` sublayer: Megatron `MambaMixer` parameterisation (as Primus trains it)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from zebra.mixers.mamba2 import MAMBA_NORM_EPS
from zebra.models.layers.norm import GatedRMSNorm
from zebra.models.layers.packed import decode_gated_norm_linear, decode_linear, derived
from zebra.models.layers.recurrent import (
    RecurrentMixer,
    depthwise_conv,
    float32_or_64,
    inverse_softplus_dt,
    log_uniform_a,
    zero_padding,
)
from zebra_kernels import mamba2_ssd, mamba2_ssd_step


class Mamba2(RecurrentMixer):
    """Mamba2 mixer (state-space duality), Megatron `MambaMixer` weights and math.

    Reference: `Transformers are SSMs <https://arxiv.org/abs/2405.21060>`_; Megatron-Core
    `megatron/core/ssm/mamba_mixer.py` (rmsnorm=True, norm_before_gate=False, D per head, conv with bias).

    Per token (Di = expand * D inner width, Hm = Di / P heads of P channels, G groups of state size N):
        [z | x | B | C | dt] = in_proj x                       widths Di, Di, G*N, G*N, Hm
        x, B, C = SiLU(causal depthwise conv(x | B | C) + bias)
        dt      = softplus(dt + dt_bias),  A = -exp(A_log)                            [Hm]
        S_t     = exp(dt A) S_{t-1} + dt B x^T,  y = C^T S_t + D x     (head h uses group h // (Hm / G))
        out     = out_proj(RMSNorm_groups(y * SiLU(z)) * weight)     (RMS over Di / G channels, eps 1e-5)

    Parameters: D*(2*Di + 2*G*N + Hm) + (Di + 2*G*N)*(W + 1) + 3*Hm + Di + Di*D
    (1B, D=Di=2048, P=64, G=8, N=64: in_proj 10.55M + out_proj 4.19M + conv/A/D/dt/norm 0.02M = 14,763,104).

    Args:
        hidden_size: model width D.
        state_dim: SSM state size N.
        head_dim: channels per head P.
        num_groups: B/C groups G (Hm a multiple of G).
        expand: Di = expand * D.
        conv_size: short convolution width W.
        layer_idx: the sublayer index (its slot in the cache).
        backend: kernel backend ("auto", "torch", "fla", "mamba_ssm").
    """

    def __init__(
        self,
        hidden_size: int,
        state_dim: int,
        head_dim: int,
        num_groups: int,
        expand: int = 1,
        conv_size: int = 4,
        layer_idx: int | None = None,
        backend: str = "auto",
    ):
        super().__init__(layer_idx, backend)
        self.d_inner = expand * hidden_size
        if self.d_inner % head_dim or (self.d_inner // head_dim) % num_groups:
            raise ValueError(
                f"Mamba2: inner width {self.d_inner} must split into heads of {head_dim} channels, "
                f"a multiple of num_groups={num_groups}"
            )
        self.state_dim, self.head_dim, self.num_groups = state_dim, head_dim, num_groups
        self.num_heads = self.d_inner // head_dim
        gn = num_groups * state_dim
        self.in_proj = nn.Linear(hidden_size, 2 * self.d_inner + 2 * gn + self.num_heads, bias=False)
        self.conv1d = depthwise_conv(self.d_inner + 2 * gn, conv_size, bias=True)
        # A_log and D in float32 (Megatron)
        self.A_log = nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32))
        self.D = nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        for p in (self.A_log, self.D, self.dt_bias):
            p._no_weight_decay = True
        self.norm = GatedRMSNorm(
            self.d_inner,
            eps=MAMBA_NORM_EPS,
            activation="swish",
            norm_before_gate=False,
            group_size=self.d_inner // num_groups,
            backend=backend,
        )
        self.out_proj = nn.Linear(self.d_inner, hidden_size, bias=False)
        self.out_proj._is_residual_out = True
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Megatron's MambaMixer init: `A_log = log U(1, 16)`, `D = 1`, `dt_bias` = softplus^-1 of a log-uniform
        dt in [1e-3, 0.1], the conv kaiming-uniform (PyTorch's default); the projections and the norm keep their own
        (or the model's) initialisation. Skips loaded weights."""
        init.copy_(self.A_log, log_uniform_a(self.num_heads, 1.0, 16.0))
        init.ones_(self.D)
        init.copy_(self.dt_bias, inverse_softplus_dt(self.num_heads))
        fan_in = self.conv1d.weight.shape[1] * self.conv1d.weight.shape[2]  # 1 * W (depthwise)
        init.kaiming_uniform_(self.conv1d.weight, a=math.sqrt(5))
        init.uniform_(self.conv1d.bias, -1.0 / math.sqrt(fan_in), 1.0 / math.sqrt(fan_in))

    def mix(self, hidden_states, state, conv_state, context):
        B, T, _ = hidden_states.shape
        Hm, P, G, N = self.num_heads, self.head_dim, self.num_groups, self.state_dim
        z, xbc, dt = decode_linear(self, self.in_proj, hidden_states, context.prenorm).split(
            [self.d_inner, self.d_inner + 2 * G * N, Hm], dim=-1
        )
        xbc, conv_state = self.short_conv(
            xbc, self.conv1d.weight.squeeze(1), self.conv1d.bias, conv_state, context
        )  # [B, T, Di + 2*G*N]
        x, b, c = xbc.split([self.d_inner, G * N, G * N], dim=-1)
        A = derived(
            self, "A", [self.A_log], lambda t: -torch.exp(float32_or_64(t[0]))
        )  # [Hm], once per version
        if context.decode_step(T):  # one fused step (one launch on a GPU), in place into a static cache
            y, state = mamba2_ssd_step(
                x.view(B, Hm, P),
                dt.view(B, Hm),
                A,
                b.view(B, G, N),
                c.view(B, G, N),
                dt_bias=self.dt_bias,
                D=self.D,
                state=state,
                mask=None if context.mask is None else context.mask[:, 0],
                inplace=context.in_place_step(T),
                feed=context.feed,
                backend=self.backend,
            )  # [B, Hm, P]
        else:
            y, state = mamba2_ssd(
                x.view(B, T, Hm, P),
                zero_padding(F.softplus(float32_or_64(dt) + self.dt_bias), context.mask),  # [B, T, Hm]
                A,
                b.view(B, T, G, N),
                c.view(B, T, G, N),
                D=self.D,
                initial_state=state,
                output_final_state=context.output_final_state,
                cu_seqlens=context.cu_seqlens,
                backend=self.backend,
            )  # [B, T, Hm, P]
        y = decode_gated_norm_linear(self, self.norm, self.out_proj, y.reshape(B, T, self.d_inner), z)
        return y, state, conv_state
