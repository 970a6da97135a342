"""Gated delta rule (GDN and KDA), chunked (WY / UT-transform form) for training and prefill.

Inside a chunk of C tokens with in-chunk cumulative log decay G_r = g_1 + ... + g_r (a K-vector for KDA, one
number per head for GDN) and entering state S0, write exp(G_r - G_j) for the decay from position j to r
(channel-wise for KDA). The per-token corrections delta_r = beta_r (v_r - k_r^T Diag(exp(g_r)) S_{r-1}) solve
a unit lower-triangular system

    (I + A) delta = beta V - beta (K * exp(G)) S0,    A[r, j] = beta_r k_r^T Diag(exp(G_r - G_j)) k_j  (j < r)

so delta = U - W S0 with U = (I + A)^-1 beta V and W = (I + A)^-1 beta (K * exp(G)). Then

    O   = (Q * exp(G)) S0 + QK delta,    QK[r, j] = q_r^T Diag(exp(G_r - G_j)) k_j  (j <= r)
    S_C = Diag(exp(G_C)) S0 + (K * exp(G_C - G))^T delta

Everything except the S0 hand-off between chunks is computed for all chunks at once; the hand-off is one
small matrix product per chunk (T / C steps, no per-token loop).
"""

from __future__ import annotations

import torch

from zebra_kernels._common import causal_mask, masked_decay, pad_time


def chunk_delta_rule(
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
        q, k: `[B, T, H, K]`. v: `[B, T, H, V]`. beta: `[B, T, H]`. All one float dtype.
        g: log decay, `[B, T, H, K]` per channel (KDA) or `[B, T, H, 1]` per head (GDN).
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
    G = g.cumsum(-2)  # [B, H, NT, C, K or 1]
    qk, kk = decayed_scores(q, k, G)  # [B, H, NT, C, C]

    A = (kk * beta[..., :, None]).masked_fill(~causal_mask(C, q.device, strict=True), 0.0)  # [B, H, NT, C, C]
    # (I + A)^-1 applied by a unit-triangular solve (the solver ignores A's zero diagonal)
    rhs = torch.cat([v * beta[..., None], k * (beta[..., None] * G.exp())], dim=-1)  # [B, H, NT, C, V + K]
    UW = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U, W = UW[..., :V], UW[..., V:]  # [B, H, NT, C, V], [B, H, NT, C, K]

    q_decayed = q * G.exp()  # [B, H, NT, C, K]
    k_to_end = k * (G[..., -1:, :] - G).exp()  # [B, H, NT, C, K]
    chunk_decay = G[..., -1, :].exp()[..., None]  # [B, H, NT, K or 1, 1]

    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(q.dtype)
    outputs = []
    for n in range(NT):
        delta = U[:, :, n] - W[:, :, n] @ S  # [B, H, C, V]
        outputs.append(q_decayed[:, :, n] @ S + qk[:, :, n] @ delta)
        S = chunk_decay[:, :, n] * S + k_to_end[:, :, n].transpose(-1, -2) @ delta
    o = torch.stack(outputs, dim=2)  # [B, H, NT, C, V]
    o = o.permute(0, 2, 3, 1, 4).reshape(B, NT * C, H, V)[:, :T]  # [B, T, H, V]
    return o, S


def decayed_scores(q: torch.Tensor, k: torch.Tensor, G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`QK[r, j] = q_r^T Diag(exp(G_r - G_j)) k_j` and the same `KK` for k_r, for j <= r (0 above the diagonal).

    Args:
        q, k: `[B, H, NT, C, K]`. G: cumulative log decay `[B, H, NT, C, K]` or `[B, H, NT, C, 1]`.

    Returns:
        QK, KK `[B, H, NT, C, C]`.
    """
    mask = causal_mask(G.shape[-2], G.device)  # [C, C]
    if G.shape[-1] == 1:  # one decay per head: it factors out of the dot products
        G = G[..., 0]  # [B, H, NT, C]
        decay = masked_decay(G[..., :, None] - G[..., None, :], mask)  # [B, H, NT, C, C]
        return (q @ k.transpose(-1, -2)) * decay, (k @ k.transpose(-1, -2)) * decay
    # One decay per channel: a masked [C, C, K] tensor with exponents <= 0 stays exact in float32 for any decay
    # (a factorised exp(G_r) exp(-G_j) would overflow for strong decays); memory C * C * K per chunk and head,
    # so lower `chunk_size` if memory is tight.
    decay = masked_decay(G[..., :, None, :] - G[..., None, :, :], mask[..., None])  # [B, H, NT, C, C, K]
    k_decayed = k[..., None, :, :] * decay  # [B, H, NT, C(r), C(j), K]: k_j exp(G_r - G_j)
    return torch.einsum("bhnrk,bhnrjk->bhnrj", q, k_decayed), torch.einsum(
        "bhnrk,bhnrjk->bhnrj", k, k_decayed
    )
