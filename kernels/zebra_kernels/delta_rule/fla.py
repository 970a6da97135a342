"""Gated delta rule on FLA's Triton kernels (`fla.ops.gated_delta_rule`), GPU only.

FLA 0.6.0 supports grouped value heads (HV a multiple of H) natively in both kernels, takes q/k L2 norm and the
GDN gate inside the kernel, and keeps states as `[N, HV, K, V]` float32 (state_v_first=False).
"""

from __future__ import annotations

import torch

from zebra_kernels.backend import fla_backward_blocker


def refuse_broken_backward(*inputs: torch.Tensor | None) -> None:
    """Raise before the forward when FLA would refuse (or get wrong) the backward on this GPU."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
        blocker = fla_backward_blocker(torch.cuda.current_device())
        if blocker is not None:
            raise RuntimeError(blocker + "; or run with backend='torch'")


def as_fla_float(x: torch.Tensor | None) -> torch.Tensor | None:
    """FLA kernels take fp32/bf16/fp16; float64 (the reference dtype) goes down to float32."""
    return x.float() if x is not None and x.dtype == torch.float64 else x


def fla_gated_delta_rule(
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
    """Shapes as `zebra_kernels.gated_delta_rule`; mode is "chunk" or "recurrent" (already resolved)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    v = as_fla_float(v)
    q, k = q.to(v.dtype), k.to(v.dtype)
    g = g.float()  # FLA's own tests and layers keep the log decay in float32
    beta = as_fla_float(beta)
    h0 = None if initial_state is None else initial_state.float()
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
        o, final_state = chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)
    else:
        o, final_state = fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kwargs)
    return o, None if final_state is None else final_state.float()
