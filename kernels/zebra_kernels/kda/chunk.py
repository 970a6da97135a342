"""Kimi delta rule (KDA), chunked (WY / UT-transform form) for training and prefill.

The gated-delta-rule chunk algebra (see zebra_kernels/gdn/chunk.py) with a per-channel decay: inside a chunk,
G_r = g_1 + ... + g_r is a K-vector and every decay between positions j <= r is the channel-wise
exp(G_r - G_j), so

    A[r, j]   = beta_r sum_d k_r[d] k_j[d] exp(G_r[d] - G_j[d])     (j < r)
    QK[r, j]  =        sum_d q_r[d] k_j[d] exp(G_r[d] - G_j[d])     (j <= r)
    U = (I + A)^-1 beta V,   W = (I + A)^-1 beta (K * exp(G)),   delta = U - W S0
    O = (Q * exp(G)) S0 + QK delta,   S_C = Diag(exp(G_C)) S0 + (K * exp(G_C - G))^T delta

The channel-wise decays are built as a masked `[C, C, K]` tensor with exponents <= 0, which stays exact in
float32 for any decay (a factorised exp(G_r) exp(-G_j) would overflow for strong decays); memory is
C * C * K per chunk and head, so lower `chunk_size` if memory is tight.
"""

from __future__ import annotations

import torch

from zebra_kernels._common import causal_mask, masked_decay, pad_time


def chunk_kimi_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked KDA on equal-length sequences (q/k already per value head and normalised).

    Args:
        q, k: `[B, T, H, K]`. v: `[B, T, H, V]`. g (per-channel log decay): `[B, T, H, K]`. beta: `[B, T, H]`.
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
    G = g.cumsum(-2)  # [B, H, NT, C, K]
    mask = causal_mask(C, q.device)[..., None]  # [C, C, 1]
    decay = masked_decay(G[..., :, None, :] - G[..., None, :, :], mask)  # [B, H, NT, C, C, K]
    k_decayed = k[..., None, :, :] * decay  # [B, H, NT, C(r), C(j), K]: k_j exp(G_r - G_j)

    A = torch.einsum("bhnrk,bhnrjk->bhnrj", k, k_decayed) * beta[..., :, None]  # [B, H, NT, C, C]
    A = A.masked_fill(~causal_mask(C, q.device, strict=True), 0.0)
    # (I + A)^-1 applied by a unit-triangular solve (the solver ignores A's zero diagonal)
    rhs = torch.cat([v * beta[..., None], k * G.exp() * beta[..., None]], dim=-1)  # [B, H, NT, C, V + K]
    UW = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U, W = UW[..., :V], UW[..., V:]  # [B, H, NT, C, V], [B, H, NT, C, K]

    qk = torch.einsum("bhnrk,bhnrjk->bhnrj", q, k_decayed)  # [B, H, NT, C, C]
    q_decayed = q * G.exp()  # [B, H, NT, C, K]
    k_to_end = k * (G[..., -1:, :] - G).exp()  # [B, H, NT, C, K]
    chunk_decay = G[..., -1, :].exp()[..., None]  # [B, H, NT, K, 1]

    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(q.dtype)
    outputs = []
    for n in range(NT):
        delta = U[:, :, n] - W[:, :, n] @ S  # [B, H, C, V]
        outputs.append(q_decayed[:, :, n] @ S + qk[:, :, n] @ delta)
        S = chunk_decay[:, :, n] * S + k_to_end[:, :, n].transpose(-1, -2) @ delta
    o = torch.stack(outputs, dim=2)  # [B, H, NT, C, V]
    o = o.permute(0, 2, 3, 1, 4).reshape(B, NT * C, H, V)[:, :T]  # [B, T, H, V]
    return o, S
