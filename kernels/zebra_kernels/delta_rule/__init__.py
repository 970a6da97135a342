"""The gated delta rule shared by GDN (`gated_delta_rule`, one log decay per head) and KDA (`kimi_delta_rule`,
one per key channel): input checks, mode and backend choice, grouped value heads, and the torch forms.

The torch forms take the decay as `[..., K]` or `[..., 1]` (broadcast over the K channels), so one naive and one
chunk implementation serve both. Each variant is a module of this folder: `gdn.py`, `kda.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from zebra_kernels._common import check_state, choose_mode, compute_dtype, l2norm, needs_grad, num_sequences
from zebra_kernels._torch_driver import run_varlen
from zebra_kernels.backend import resolve_backend
from zebra_kernels.delta_rule.chunk import chunk_delta_rule
from zebra_kernels.delta_rule.naive import naive_recurrent_delta_rule

__all__ = ["DeltaRuleVariant", "chunk_delta_rule", "delta_rule", "naive_recurrent_delta_rule"]


@dataclass(frozen=True)
class DeltaRuleVariant:
    """What tells GDN and KDA apart.

    Attributes:
        name: "GDN" or "KDA" (in error messages).
        per_channel: the log decay g is `[B, T, HV, K]` (KDA) rather than `[B, T, HV]` (GDN).
        gate: `gate(raw, A_log, dt_bias) -> g`, the log decay from the raw gate projection (`use_gate_in_kernel`).
    """

    name: str
    per_channel: bool
    gate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def delta_rule(
    variant: DeltaRuleVariant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm: bool,
    use_gate_in_kernel: bool,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    use_beta_sigmoid_in_kernel: bool,
    allow_neg_eigval: bool,
    mode: str,
    chunk_size: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`gated_delta_rule` / `kimi_delta_rule` (see those for the arguments), for the variant's decay shape."""
    _check_shapes(variant, q, k, v, g, beta)
    if use_gate_in_kernel and A_log is None:
        raise ValueError("use_gate_in_kernel=True needs A_log [HV]")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval=True needs use_beta_sigmoid_in_kernel=True (beta as logits)")
    T, K, HV, V = q.shape[1], q.shape[3], v.shape[2], v.shape[3]
    N = num_sequences(q, cu_seqlens)
    check_state(initial_state, (N, HV, K, V))
    scale = K**-0.5 if scale is None else scale
    grad = needs_grad(q, k, v, g, beta, initial_state, A_log, dt_bias)
    mode = choose_mode(mode, T, grad)

    if resolve_backend(backend, q.device) == "fla":
        if mode == "recurrent" and grad:
            raise ValueError(
                f"FLA's recurrent {variant.name} kernel has no backward: use mode='chunk' (or 'auto') for training"
            )
        from zebra_kernels.delta_rule.fla_backend import fla_delta_rule

        return fla_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            per_channel=variant.per_channel,
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm=use_qk_l2norm,
            mode=mode,
            use_gate_in_kernel=use_gate_in_kernel,
            A_log=A_log,
            dt_bias=dt_bias,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
            allow_neg_eigval=allow_neg_eigval,
        )

    # The torch forms: the decay and the grouped q/k in their shapes, then the chunk (`mode="chunk"`) or the
    # naive recurrent form over each sequence.
    H = q.shape[2]
    out_dtype, dtype = v.dtype, compute_dtype(q, k, v, g, beta, initial_state, A_log, dt_bias)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * 2.0 if allow_neg_eigval else beta.sigmoid()
    g = variant.gate(g, A_log, dt_bias) if use_gate_in_kernel else g.to(dtype)
    if not variant.per_channel:
        g = g[..., None]  # [B, T, HV, 1]: one decay for all K channels
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    if HV != H:  # value head j uses q/k head j // (HV // H)
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)  # [B, T, HV, K]
    if mode == "chunk" and T > 0:
        form, options = chunk_delta_rule, {"scale": scale, "chunk_size": chunk_size}
    else:
        form, options = naive_recurrent_delta_rule, {"scale": scale}
    o, S = run_varlen(form, [q, k, v, g, beta], initial_state, cu_seqlens, **options)
    return o.to(out_dtype), (S if output_final_state else None)


def _check_shapes(
    variant: DeltaRuleVariant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> None:
    """ValueError naming the offending shapes unless q, k `[B, T, H, K]`, v `[B, T, HV, V]` (HV a multiple of
    H), g `[B, T, HV]` (`[B, T, HV, K]` per channel) and beta `[B, T, HV]` fit together."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    if k.shape != q.shape:
        raise ValueError(
            f"q and k must have the same shape [B, T, H, K], got {list(q.shape)} and {list(k.shape)}"
        )
    if v.shape[:2] != q.shape[:2] or HV % H != 0:
        raise ValueError(f"v must be [B, T, HV, V] with HV a multiple of H={H}, got {list(v.shape)}")
    beta_dims = {"B": B, "T": T, "HV": HV}
    g_dims = {**beta_dims, "K": K} if variant.per_channel else beta_dims
    for name, x, dims in (("g", g, g_dims), ("beta", beta, beta_dims)):
        if tuple(x.shape) != tuple(dims.values()):
            raise ValueError(
                f"{name} must have shape [{', '.join(dims)}] = {list(dims.values())}, got {list(x.shape)}"
            )
