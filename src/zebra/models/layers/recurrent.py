"""Pieces shared by the recurrent mixers (Mamba2, GDN, KDA): base classes, padding masks, decay-parameter init.

Padding: a pad token must leave the recurrent state untouched, so that a left-padded sequence gives the same
output as the unpadded one. The mixers zero the conv inputs of pad tokens (a causal conv then sees zeros, exactly
as before the first token) and give pads a no-op update (log decay g = 0, beta = 0 for the delta rules; dt = 0
for SSD). Exact for left padding and for padding inside a sequence; the conv state after trailing (right)
padding would hold zeros, so generate with left padding.

`RecurrentMixer` is the base of the three mixers: it reads and writes the sublayer's cache slot, turns the HF
attention mask into the pad mask and runs the short convolution; `DeltaRuleMixer` adds the forward and the
initialisation GDN and KDA share. Each layer file keeps its parameters and its own math.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import initialization as init

from zebra.models.layers.packed import Prenorm, decode_gated_norm_linear, derived, project
from zebra_kernels import causal_conv1d, causal_conv1d_step_

if TYPE_CHECKING:
    from zebra.models.cache_zebra import ZebraCache


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


@dataclass(frozen=True)
class MixerContext:
    """What one forward of a recurrent mixer needs besides its input and states.

    Attributes:
        mask: `[B, T]` bool, False at pad tokens, or None (no padding).
        cu_seqlens: `[N + 1]` packed-sequence offsets (B == 1), or None.
        output_final_state: a cache is attached, so the kernels return their final states.
        feed: a static cache's `feed` flag (0-d bool): a one-token step without gradient then updates the
            cache's state buffers in place where it is True (`in_place_step`); None otherwise.
        prenorm: the sublayer's pre-norm for the first projection (a fused decode step), or None.
    """

    mask: torch.Tensor | None
    cu_seqlens: torch.Tensor | None
    output_final_state: bool
    feed: torch.Tensor | None = None
    prenorm: Prenorm | None = None

    def decode_step(self, T: int) -> bool:
        """One token per row into a cache, without gradient: the fused one-token step kernels apply."""
        return T == 1 and self.output_final_state and self.cu_seqlens is None and not torch.is_grad_enabled()

    def in_place_step(self, T: int) -> bool:
        """A decode step into a static cache: the step kernels write its state buffers themselves."""
        return self.feed is not None and self.decode_step(T)


class RecurrentMixer(nn.Module):
    """Base of the recurrent mixers: cache slot, pad mask and short convolution around the subclass's `mix`.

    Args:
        layer_idx: the sublayer index (its slot in the cache).
        backend: kernel backend ("auto", "torch", "fla").
    """

    fused_decode: bool = False  # `packed.use_fused_decode`: decode GEMVs on Zebra's kernels

    def __init__(self, layer_idx: int | None, backend: str):
        super().__init__()
        self.layer_idx = layer_idx
        self.backend = backend

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        cache: ZebraCache | None = None,
        cu_seqlens: torch.Tensor | None = None,
        prenorm: Prenorm | None = None,
        **unused,
    ) -> torch.Tensor:
        """`[B, T, D] -> [B, T, D]`; reads and updates this sublayer's states in `cache`.

        Args:
            hidden_states: `[B, T, D]`.
            attention_mask: `[B, L]` (HF, over cached + new tokens); pad tokens leave the state unchanged.
            cache: the model's `ZebraCache`, or None.
            cu_seqlens: `[N + 1]` packed-sequence offsets (B == 1).
            prenorm: the sublayer's pre-norm, still to apply to `hidden_states` by the first projection.
        """
        mask = current_token_mask(attention_mask, hidden_states.shape[1])  # [B, T] or None
        feed = cache.feed if cache is not None and cache.static else None
        context = MixerContext(
            mask, cu_seqlens, output_final_state=cache is not None, feed=feed, prenorm=prenorm
        )
        state, conv_state = cache.recurrent_state(self.layer_idx) if cache is not None else (None, None)
        out, state, conv_state = self.mix(hidden_states, state, conv_state, context)
        if cache is not None:
            cache.update_recurrent(self.layer_idx, state, conv_state)
        return out

    def mix(
        self,
        hidden_states: torch.Tensor,
        state: torch.Tensor | None,
        conv_state: torch.Tensor | None,
        context: MixerContext,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The mixer's own math: `[B, T, D]` and the entering recurrent and conv states (None: zeros) -> the
        output `[B, T, D]` and the final states (None unless `context.output_final_state`)."""
        raise NotImplementedError

    def short_conv(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        conv_state: torch.Tensor | None,
        context: MixerContext,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`SiLU(causal depthwise conv(x) + bias)` of `x [B, T, C]` (weight `[C, W]`) with pad tokens zeroed
        first; returns `[B, T, C]` and the conv state `[B, C, W]` (None unless `context.output_final_state`;
        a static cache's own buffer, rolled in place, for a decode token)."""
        if context.in_place_step(x.shape[1]):
            y = causal_conv1d_step_(
                zero_padding(x, context.mask)[:, 0],
                weight,
                bias,
                state=conv_state,
                feed=context.feed,
                activation="silu",
                backend=self.backend,
            )  # [B, C]
            return y[:, None], conv_state
        return causal_conv1d(
            zero_padding(x, context.mask),
            weight,
            bias,
            activation="silu",
            initial_state=conv_state,
            output_final_state=context.output_final_state,
            cu_seqlens=context.cu_seqlens,
            backend=self.backend,
        )


class QKVConvMixer(RecurrentMixer):
    """A recurrent mixer whose q, k and v each pass their own depthwise short conv, run as one (GDN, KDA, GLA):
    `add_qkv_convs` builds them (after `key_dim` / `value_dim` are set), `conv_weight` joins them."""

    def add_qkv_convs(self, conv_size: int) -> None:
        """q_conv1d, k_conv1d `[key_dim, 1, W]` and v_conv1d `[value_dim, 1, W]`, bias-free, in that order."""
        self.q_conv1d = depthwise_conv(self.key_dim, conv_size)
        self.k_conv1d = depthwise_conv(self.key_dim, conv_size)
        self.v_conv1d = depthwise_conv(self.value_dim, conv_size)

    def conv_weight(self) -> torch.Tensor:
        """The q/k/v short-conv weights as one `[C, W]` (made once per weight version while decoding)."""
        convs = [self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight]
        return derived(self, "conv_weight", convs, lambda ws: torch.cat(ws).squeeze(1))


class DeltaRuleMixer(QKVConvMixer):
    """The forward GDN and KDA share: q/k/v through one short conv (SiLU), write strength beta = sigmoid(b_proj x)
    (times 2 with allow_neg_eigval), a gated delta rule with L2-normalised q/k, then a gated RMSNorm per value
    head and o_proj.

    Subclasses build the parameters (q/k/v_proj, q/k/v_conv1d, b_proj, g_proj, A_log, dt_bias, o_norm, o_proj)
    and the sizes num_heads H, head_dim K, value_heads HV, head_v_dim V, key_dim, value_dim, allow_neg_eigval;
    they set `kernel`, `gate` (the kernel's `use_gate_in_kernel` formula) and `a_low`, list in `projections` the
    bias-free linears of the input (one GEMV while decoding, `packed.project`), and give the raw decay and the
    output gate from those projections.
    Without padding the gate and beta's sigmoid run inside the kernel (as in FLA's layers); with padding they run
    here so pads get the no-op update (decay 0, beta 0).
    """

    kernel: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]  # gated_delta_rule / kimi_delta_rule
    gate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]  # gdn_gate / kda_gate
    a_low: float  # A = exp(A_log) starts uniform in [a_low, 16]

    # one GEMM for the input projections in training too (`zebra.models.layers.packed.project`)
    fuse_projections: bool = False
    projections: tuple[str, ...]  # q_proj, k_proj, v_proj, b_proj first, then what raw_decay/output_gate read

    def reset_parameters(self) -> None:
        """`A_log = log U(a_low, 16)` and `dt_bias` = softplus^-1 of a log-uniform dt in [1e-3, 0.1] (FLA); the
        projections, convs and norm keep their own (or the model's) initialisation. Skips loaded weights."""
        init.copy_(self.A_log, log_uniform_a(self.A_log.numel(), self.a_low, 16.0))
        init.copy_(self.dt_bias, inverse_softplus_dt(self.dt_bias.numel()))

    def raw_decay(self, projected: dict[str, torch.Tensor]) -> torch.Tensor:
        """The raw decay from the input projections: `[B, T, HV]` (GDN) or `[B, T, HV, K]` (KDA)."""
        raise NotImplementedError

    def output_gate(self, projected: dict[str, torch.Tensor]) -> torch.Tensor:
        """The output gate from the input projections, `[B, T, HV * V]`."""
        raise NotImplementedError

    def mix(self, hidden_states, state, conv_state, context):
        B, T, _ = hidden_states.shape
        H, K, HV, V = self.num_heads, self.head_dim, self.value_heads, self.head_v_dim
        qkv, *rest = project(
            self, hidden_states, self.projections, joined=3, prenorm=context.prenorm
        )  # [B, T, 2*H*K + HV*V], ...
        projected = dict(zip(self.projections[3:], rest, strict=True))
        qkv, conv_state = self.short_conv(qkv, self.conv_weight(), None, conv_state, context)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, HV, V)

        g = self.raw_decay(projected)  # [B, T, HV] or [B, T, HV, K]
        if context.mask is None:  # the gate and beta's sigmoid are fused into the kernel
            beta = projected["b_proj"]  # [B, T, HV] logits
            gate_kwargs = {
                "use_gate_in_kernel": True,
                "A_log": self.A_log,
                "dt_bias": self.dt_bias,
                "use_beta_sigmoid_in_kernel": True,
                "allow_neg_eigval": self.allow_neg_eigval,
            }
        else:  # pads get the no-op update: decay 0 and beta 0
            beta = float32_or_64(projected["b_proj"]).sigmoid()  # [B, T, HV]
            if self.allow_neg_eigval:
                beta = beta * 2.0
            g, gate_kwargs = zero_padding(self.gate(g, self.A_log, self.dt_bias), context.mask), {}
            beta = zero_padding(beta, context.mask)
        o, state = self.kernel(
            q,
            k,
            v,
            g,
            beta,
            initial_state=state,
            output_final_state=context.output_final_state,
            cu_seqlens=context.cu_seqlens,
            use_qk_l2norm=True,
            backend=self.backend,
            **gate_kwargs,
        )  # [B, T, HV, V]
        gate = self.output_gate(projected)  # [B, T, HV * V]
        o = decode_gated_norm_linear(self, self.o_norm, self.o_proj, o.reshape(B, T, HV * V), gate)
        return o, state, conv_state
