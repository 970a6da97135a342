"""Mamba2 state-space duality (SSD) scan: `mamba2_ssd`, with grouped B/C."""

from __future__ import annotations

import torch

from zebra_kernels._common import check_state, choose_mode, compute_dtype, needs_grad, num_sequences
from zebra_kernels._torch_driver import run_varlen
from zebra_kernels.backend import resolve_ssd_backend
from zebra_kernels.mamba2.chunk import chunk_ssd
from zebra_kernels.mamba2.naive import naive_recurrent_ssd
from zebra_kernels.mamba2.step import mamba2_ssd_step

__all__ = ["chunk_ssd", "mamba2_ssd", "mamba2_ssd_step", "naive_recurrent_ssd"]


def mamba2_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    mode: str = "auto",
    chunk_size: int = 64,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""Mamba2 SSD scan (Megatron/Primus MambaMixer semantics, after the conv and dt softplus).

    `S_t = exp(dt_t A) S_{t-1} + dt_t B_t x_t^T`, `y_t = S_t^T C_t + D x_t`, per head; heads split into G
    groups contiguously (head h uses B/C group `h // (H // G)`).

    Args:
        x: inputs `[B, T, H, P]`.
        dt: step sizes `[B, T, H]`, already through softplus (+ dt_bias), > 0.
        A: `[H]`, negative (`-exp(A_log)`).
        B: input projections `[B, T, G, N]`, H a multiple of G.
        C: output projections `[B, T, G, N]`.
        D: skip `[H]` or None.
        initial_state: `[N_seq, H, N, P]` (N_seq = B, or the number of packed sequences); None means zeros.
        output_final_state: also return the final state `[N_seq, H, N, P]`.
        cu_seqlens: `[N_seq + 1]` int offsets of packed sequences (then B == 1); no state crosses a boundary.
        mode: "chunk", "recurrent" or "auto" (recurrent when T <= 64 and no grad is needed, else chunk).
        chunk_size: chunk length of the torch chunk form (FLA and mamba-ssm use their own).
        backend: "auto", "torch", "fla" (FLA's simple-GLA kernels) or "mamba_ssm" (mamba-ssm's chunked scan for
            `mode="chunk"`, FLA's recurrent kernel for decode); see `resolve_ssd_backend`.

    Returns:
        y `[B, T, H, P]` in x's dtype, and the final state `[N_seq, H, N, P]` (float32; float64 when the
        inputs are float64) or None.

    Examples:
        >>> Bt, T, H, P, G, N = 2, 100, 4, 8, 2, 16
        >>> x, dt = torch.randn(Bt, T, H, P), torch.rand(Bt, T, H)
        >>> A = -torch.rand(H)
        >>> B, C = torch.randn(Bt, T, G, N), torch.randn(Bt, T, G, N)
        >>> y, state = mamba2_ssd(x, dt, A, B, C, D=torch.ones(H), output_final_state=True)
        >>> y.shape, state.shape
        (torch.Size([2, 100, 4, 8]), torch.Size([2, 4, 16, 8]))
    """
    _check_shapes(x, dt, A, B, C, D)
    T, H, P, N = x.shape[1], x.shape[2], x.shape[3], B.shape[3]
    N_seq = num_sequences(x, cu_seqlens)
    check_state(initial_state, (N_seq, H, N, P))
    grad = needs_grad(x, dt, A, B, C, D, initial_state)
    mode = choose_mode(mode, T, grad)

    chosen = resolve_ssd_backend(backend, x.device, mode)
    if chosen != "torch":
        return _gpu_ssd(chosen, x, dt, A, B, C, D, initial_state, output_final_state, cu_seqlens, mode, grad)

    # The torch forms: the chunk form (`mode="chunk"`) or the naive recurrent form with B/C per head, over each
    # sequence, then the D skip.
    out_dtype, dtype = x.dtype, compute_dtype(x, dt, A, B, C, D, initial_state)
    x, dt, A, B, C = (t.to(dtype) for t in (x, dt, A, B, C))
    if mode == "chunk" and T > 0:

        def scan(x, dt, B, C, initial_state):
            return chunk_ssd(x, dt, A, B, C, initial_state, chunk_size=chunk_size)
    else:

        def scan(x, dt, B, C, initial_state):
            R = x.shape[2] // B.shape[2]  # the naive form takes B/C per head
            return naive_recurrent_ssd(
                x, dt, A, B.repeat_interleave(R, 2), C.repeat_interleave(R, 2), initial_state
            )

    y, S = run_varlen(scan, [x, dt, B, C], initial_state, cu_seqlens)
    if D is not None:
        y = y + D.to(dtype)[:, None] * x
    return y.to(out_dtype), (S if output_final_state else None)


def _check_shapes(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
) -> None:
    """ValueError naming the offending shapes unless x `[B, T, H, P]`, dt `[B, T, H]`, A and D `[H]` and B, C
    `[B, T, G, N]` (H a multiple of G) fit together."""
    Bt, T, H, _ = x.shape
    if tuple(dt.shape) != (Bt, T, H):
        raise ValueError(f"dt must have shape [B, T, H] = {[Bt, T, H]}, got {list(dt.shape)}")
    if tuple(A.shape) != (H,) or (D is not None and tuple(D.shape) != (H,)):
        raise ValueError(
            f"A and D must have shape [H] = [{H}], got {list(A.shape)} and {None if D is None else list(D.shape)}"
        )
    if B.shape != C.shape or B.shape[:2] != x.shape[:2] or H % B.shape[2] != 0:
        raise ValueError(
            f"B and C must be [B, T, G, N] with H={H} a multiple of G, got {list(B.shape)}, {list(C.shape)}"
        )


def _gpu_ssd(
    chosen: str,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    mode: str,
    grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`mamba2_ssd` on the GPU backend `chosen` ("mamba_ssm" or "fla"; mode already resolved)."""
    if chosen == "mamba_ssm":
        from zebra_kernels.mamba2.mamba_ssm_backend import mamba_ssm_ssd

        y, S = mamba_ssm_ssd(
            x,
            dt,
            A,
            B,
            C,
            D,
            initial_state=initial_state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
        )
        return y.to(x.dtype), S
    if mode == "recurrent" and grad:
        raise ValueError(
            "FLA's recurrent simple-GLA kernel is for inference: use mode='chunk' (or 'auto') for training"
        )
    from zebra_kernels.mamba2.fla_backend import fla_ssd

    y, S = fla_ssd(
        x,
        dt,
        A,
        B,
        C,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        mode=mode,
    )
    if D is not None:
        y = y + (D[:, None] * x).to(y.dtype)
    return y.to(x.dtype), S
