"""Gated delta rule (GDN and KDA) on FLA's Triton kernels, GPU only.

FLA 0.6.0's `fla.ops.gated_delta_rule` (GDN) and `fla.ops.kda` (KDA) take g as the activated log decay by
default and the raw gate projection with `use_gate_in_kernel=True` (plus A_log [HV] and dt_bias: [HV] for GDN,
[HV*K] for KDA), beta as logits with `use_beta_sigmoid_in_kernel=True` (x2 with `allow_neg_eigval`, as FLA's
layers pass them); all four kernels support grouped value heads, L2-normalise q/k in the kernel, and keep states
`[N, HV, K, V]` float32 (state_v_first=False). The recurrent kernels have no backward.
"""

from __future__ import annotations

import torch

from zebra_kernels.backend import as_fla_float, refuse_broken_backward


def fla_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    per_channel: bool,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm: bool,
    mode: str,
    use_gate_in_kernel: bool,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    use_beta_sigmoid_in_kernel: bool,
    allow_neg_eigval: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as `zebra_kernels.gated_delta_rule` (`per_channel=False`) or `kimi_delta_rule` (True); mode is
    "chunk" or "recurrent" (already resolved)."""
    if per_channel:
        from fla.ops.kda import chunk_kda, fused_recurrent_kda

        chunk, recurrent = chunk_kda, fused_recurrent_kda
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

        chunk, recurrent = chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    v = as_fla_float(v)
    q, k = q.to(v.dtype), k.to(v.dtype)
    # FLA's own tests and layers keep the log decay in float32; the raw gate input goes as it is (FLA's layers)
    g = as_fla_float(g) if use_gate_in_kernel else g.float()
    beta = as_fla_float(beta)
    h0 = None if initial_state is None else initial_state.float()  # chunk_kda asserts a float32 state
    kwargs = dict(
        scale=scale,
        initial_state=h0,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm,
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(q.device, torch.long),
    )
    if use_gate_in_kernel:
        kwargs.update(use_gate_in_kernel=True, A_log=as_fla_float(A_log), dt_bias=as_fla_float(dt_bias))
    if use_beta_sigmoid_in_kernel:
        kwargs.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=allow_neg_eigval)
    if mode == "chunk":
        refuse_broken_backward(q, k, v, g, beta, h0, A_log, dt_bias)
        o, final_state = chunk(q, k, v, g, beta, **kwargs)
    else:  # by keyword: FLA's GDN recurrent kernel has gk/gv between g and beta
        o, final_state = recurrent(q, k, v, g=g, beta=beta, **kwargs)
    return o, None if final_state is None else final_state.float()
