"""Mamba2 SSD on FLA's simple-GLA kernels (`fla.ops.simple_gla`), GPU only, no mamba-ssm build needed.

SSD == simple GLA with q = C, k = B, v = x * dt, g = dt * A and scale 1; FLA's state `[N, H, K, V]` is then
`[N, H, N_state, P]`, the Mamba2 state layout. simple GLA has no groups, so B and C are repeated per head.
"""

from __future__ import annotations

import torch

from zebra_kernels.backend import as_fla_float, refuse_broken_backward


def fla_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    mode: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as `zebra_kernels.mamba2_ssd` (without D); mode is "chunk" or "recurrent" (already resolved)."""
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

    H, G = x.shape[2], B.shape[2]
    x = as_fla_float(x)
    q = C.to(x.dtype).repeat_interleave(H // G, dim=2)  # [B, T, H, N]: head h reads group h // (H // G)
    k = B.to(x.dtype).repeat_interleave(H // G, dim=2)  # [B, T, H, N]
    v = (x * dt[..., None]).to(x.dtype)  # [B, T, H, P]
    g = dt.float() * A.float()  # [B, T, H] log decay, float32 as FLA's cumsum expects
    h0 = None if initial_state is None else initial_state.float()
    kwargs = dict(
        scale=1.0,
        initial_state=h0,
        output_final_state=output_final_state,
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(x.device, torch.long),
    )
    if mode == "chunk":
        refuse_broken_backward(x, dt, A, B, C, h0)
        y, final_state = chunk_simple_gla(q, k, v, g=g, **kwargs)
    else:
        y, final_state = fused_recurrent_simple_gla(q, k, v, g=g, **kwargs)
    return y, None if final_state is None else final_state.float()
