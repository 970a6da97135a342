"""Gated linear attention on FLA's Triton kernels, GPU only: FLA 0.6.0's `fla.ops.gla` (`chunk_gla` for
training and prefill, `fused_recurrent_gla` for short inputs), states `[N, H, K, V]` float32
(state_v_first=False), the log decay in float32 as FLA's layer passes it."""

from __future__ import annotations

import torch

from zebra_kernels.backend import as_fla_float


def fla_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    mode: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as `zebra_kernels.gla.gated_linear_attention`; mode is "chunk" or "recurrent" (resolved)."""
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    v = as_fla_float(v)
    q, k = q.to(v.dtype), k.to(v.dtype)
    kwargs = dict(
        scale=scale,
        initial_state=None if initial_state is None else initial_state.float(),
        output_final_state=output_final_state,
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(q.device, torch.long),
    )
    if mode == "chunk":
        o, final_state = chunk_gla(q, k, v, g.float(), **kwargs)
    else:
        o, final_state = fused_recurrent_gla(q, k, v, gk=g.float(), **kwargs)
    return o, None if final_state is None else final_state.float()
