"""Gated delta rule, chunked (WY / UT-transform form) for training and prefill.

Inside a chunk of C tokens with in-chunk cumulative log decay G_r = g_1 + ... + g_r and entering state S0,
the per-token corrections delta_r = beta_r (v_r - k_r^T exp(g_r) S_{r-1}) solve a unit lower-triangular system

    (I + A) delta = beta V - beta (K * exp(G)) S0,    A[r, j] = beta_r (k_r . k_j) exp(G_r - G_j)  (j < r)

so delta = U - W S0 with U = (I + A)^-1 beta V and W = (I + A)^-1 beta (K * exp(G)). Then

    O   = (Q * exp(G)) S0 + ((Q K^T) * exp(G_r - G_j), j <= r) delta
    S_C = exp(G_C) S0 + (K * exp(G_C - G))^T delta

Everything except the S0 hand-off between chunks is computed for all chunks at once; the hand-off is one
small matrix product per chunk (T / C steps, no per-token loop).
"""

from __future__ import annotations

import torch

from zebra_kernels._common import causal_mask, masked_decay, pad_time


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule on equal-length sequences (q/k already per value head and normalised).

    Args:
        q, k: `[B, T, H, K]`. v: `[B, T, H, V]`. g (log decay), beta: `[B, T, H]`. All one float dtype.
        scale: multiplies q.
        initial_state: `[B, H, K, V]` or None (zeros).
        chunk_size: tokens per chunk C; T need not be a multiple (the tail is zero-padded, which is neutral).

    Returns:
        o `[B, T, H, V]` and the final state `[B, H, K, V]`, in the inputs' dtype.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    C = chunk_size
    q, k, v, g, beta = (pad_time(x, C) for x in (q, k, v, g, beta))
    NT = q.shape[1] // C

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [B, NT*C, H, ...] -> [B, H, NT, C, ...]
        x = x.reshape(B, NT, C, H, *x.shape[3:])
        return x.permute(0, 3, 1, 2, *range(4, x.dim()))

    q, k, v, g, beta = chunks(q) * scale, chunks(k), chunks(v), chunks(g), chunks(beta)
    G = g.cumsum(-1)  # [B, H, NT, C]
    decay = masked_decay(G[..., :, None] - G[..., None, :], causal_mask(C, q.device))  # [B, H, NT, C, C]

    A = (k @ k.transpose(-1, -2)) * decay * beta[..., :, None]  # [B, H, NT, C, C]
    A = A.masked_fill(~causal_mask(C, q.device, strict=True), 0.0)
    # (I + A)^-1 applied by a unit-triangular solve (the solver ignores A's zero diagonal)
    rhs = torch.cat([v * beta[..., None], k * (beta * G.exp())[..., None]], dim=-1)  # [B, H, NT, C, V + K]
    UW = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U, W = UW[..., :V], UW[..., V:]  # [B, H, NT, C, V], [B, H, NT, C, K]

    qk = (q @ k.transpose(-1, -2)) * decay  # [B, H, NT, C, C]
    q_decayed = q * G.exp()[..., None]  # [B, H, NT, C, K]
    k_to_end = k * (G[..., -1:] - G).exp()[..., None]  # [B, H, NT, C, K]
    chunk_decay = G[..., -1].exp()[..., None, None]  # [B, H, NT, 1, 1]

    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(q.dtype)
    outputs = []
    for n in range(NT):
        delta = U[:, :, n] - W[:, :, n] @ S  # [B, H, C, V]
        outputs.append(q_decayed[:, :, n] @ S + qk[:, :, n] @ delta)
        S = chunk_decay[:, :, n] * S + k_to_end[:, :, n].transpose(-1, -2) @ delta
    o = torch.stack(outputs, dim=2)  # [B, H, NT, C, V]
    o = o.permute(0, 2, 3, 1, 4).reshape(B, NT * C, H, V)[:, :T]  # [B, T, H, V]
    return o, S
