"""Kimi delta rule on FLA's Triton kernels (`fla.ops.kda`), GPU only.

FLA 0.6.0's `chunk_kda` / `fused_recurrent_kda` take g as the activated log decay by default and the raw
`f_proj` output with `use_gate_in_kernel=True` (plus A_log [HV], dt_bias [HV*K]); both support grouped value
heads and keep states `[N, HV, K, V]` float32 (state_v_first=False). The recurrent kernel has no backward.
"""

from __future__ import annotations

import torch

from zebra_kernels.gdn.fla import as_fla_float, refuse_broken_backward


def fla_kimi_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm: bool,
    mode: str,
    use_gate_in_kernel: bool,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as `zebra_kernels.kimi_delta_rule`; mode is "chunk" or "recurrent" (already resolved)."""
    from fla.ops.kda import chunk_kda, fused_recurrent_kda

    v = as_fla_float(v)
    q, k = q.to(v.dtype), k.to(v.dtype)
    g = g.float()
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
    if mode == "chunk":
        refuse_broken_backward(q, k, v, g, beta, h0, A_log, dt_bias)
        o, final_state = chunk_kda(q, k, v, g, beta, **kwargs)
    else:
        o, final_state = fused_recurrent_kda(q, k, v, g, beta, **kwargs)
    return o, None if final_state is None else final_state.float()
