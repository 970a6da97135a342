"""Gated linear attention (GLA): `gated_linear_attention`, a linear attention whose state decays per key channel;
the torch form is in `naive`, FLA's kernels in `fla`."""

from __future__ import annotations

import torch

from zebra_kernels._common import check_state, choose_mode, compute_dtype, needs_grad, num_sequences
from zebra_kernels._torch_driver import run_varlen
from zebra_kernels.backend import resolve_backend
from zebra_kernels.gla.naive import naive_recurrent_gla

__all__ = ["gated_linear_attention", "naive_recurrent_gla"]


def gated_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    mode: str = "auto",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""Gated linear attention, FLA 0.6.0 `fla.ops.gla` semantics.

    `S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T`, `o_t = S_t^T (scale q_t)`, per head.

    Args:
        q: queries `[B, T, H, K]`.
        k: keys `[B, T, H, K]`.
        v: values `[B, T, H, V]`.
        g: log decay per key channel `[B, T, H, K]` (<= 0, already activated).
        scale: multiplies q; default `K ** -0.5`.
        initial_state: `[N, H, K, V]` (N = B, or the number of packed sequences); None means zeros.
        output_final_state: also return the final state `[N, H, K, V]`.
        cu_seqlens: `[N + 1]` int offsets of packed sequences (then B == 1); no state crosses a boundary.
        mode: "chunk", "recurrent" or "auto" (recurrent when T <= 64 and no grad is needed, else chunk); the
            torch backend runs the recurrent form for both.
        backend: "auto", "torch" or "fla" (see `resolve_backend`).

    Returns:
        o `[B, T, H, V]` in v's dtype, and the final state `[N, H, K, V]` (float32; float64 when the inputs
        are float64) or None.
    """
    if k.shape != q.shape or g.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"q, k, g must be [B, T, H, K] and v [B, T, H, V], got {list(q.shape)}, {list(k.shape)}, "
            f"{list(g.shape)} and {list(v.shape)}"
        )
    T, H, K, V = q.shape[1], q.shape[2], q.shape[3], v.shape[3]
    check_state(initial_state, (num_sequences(q, cu_seqlens), H, K, V))
    scale = K**-0.5 if scale is None else scale
    mode = choose_mode(mode, T, needs_grad(q, k, v, g, initial_state))
    if resolve_backend(backend, q.device) == "fla":
        from zebra_kernels.gla.fla_backend import fla_gla

        return fla_gla(
            q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            cu_seqlens=cu_seqlens, mode=mode,
        )  # fmt: skip
    out_dtype, dtype = v.dtype, compute_dtype(q, k, v, g, initial_state)
    q, k, v, g = (x.to(dtype) for x in (q, k, v, g))
    o, S = run_varlen(naive_recurrent_gla, [q, k, v, g], initial_state, cu_seqlens, scale=scale)
    return o.to(out_dtype), (S if output_final_state else None)
