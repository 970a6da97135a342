"""Mamba2 SSD, chunked (the SSD / simple-GLA chunk form) for training and prefill.

Per head the decay is a scalar a_t = dt_t A. Inside a chunk with cumulative decay G_r = a_1 + ... + a_r,
X = x * dt and entering state S0:

    Y   = ((C B^T) * exp(G_r - G_j), j <= r) X  +  (C * exp(G)) S0
    S_C = exp(G_C) S0 + (B * exp(G_C - G))^T X

The states entering each chunk follow S_{n+1} = exp(G_C,n) S_n + dS_n, solved for all chunks at once with a
masked [NT + 1, NT] decay matrix (no loop). C B^T is computed once per group and shared by its heads.
"""

from __future__ import annotations

import torch

from zebra_kernels._common import causal_mask, masked_decay, pad_time


def chunk_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD on equal-length sequences.

    Args:
        x: `[Bt, T, H, P]`. dt: `[Bt, T, H]` (> 0). A: `[H]` (< 0). B, C: `[Bt, T, G, N]`, head h uses group
            `h // (H // G)`. One float dtype.
        initial_state: `[Bt, H, N, P]` or None (zeros).
        chunk_size: tokens per chunk L; T need not be a multiple (the tail is zero-padded: dt = 0 is neutral).

    Returns:
        y `[Bt, T, H, P]` (without the D skip) and the final state `[Bt, H, N, P]`.
    """
    Bt, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    R = H // G  # heads per group
    L = chunk_size
    x, dt, B, C = (pad_time(t, L) for t in (x, dt, B, C))
    NT = x.shape[1] // L

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [Bt, NT*L, X, ...] -> [Bt, X, NT, L, ...]
        t = t.reshape(Bt, NT, L, *t.shape[2:])
        return t.permute(0, 3, 1, 2, *range(4, t.dim()))

    X = chunks(x * dt[..., None]).reshape(Bt, G, R, NT, L, P)  # heads split by group
    a = chunks(dt * A).reshape(Bt, G, R, NT, L)  # log decay per step
    Bc, Cc = chunks(B)[:, :, None], chunks(C)[:, :, None]  # [Bt, G, 1, NT, L, N]
    cum = a.cumsum(-1)  # [Bt, G, R, NT, L]

    decay = masked_decay(cum[..., :, None] - cum[..., None, :], causal_mask(L, x.device))  # [.., L, L]
    y = ((Cc @ Bc.transpose(-1, -2)) * decay) @ X  # [Bt, G, R, NT, L, P]  intra-chunk

    # state contributed by each chunk, then the states entering every chunk (and the final one)
    dS = (Bc * (cum[..., -1:] - cum).exp()[..., None]).transpose(-1, -2) @ X  # [Bt, G, R, NT, N, P]
    chunk_log = cum[..., -1]  # [Bt, G, R, NT]
    before = torch.cat(
        [chunk_log.new_zeros(*chunk_log.shape[:-1], 1), chunk_log.cumsum(-1)], dim=-1
    )  # [.., NT+1]
    # entering[n] = sum_{m < n} exp(before[n] - before[m + 1]) dS[m] + exp(before[n]) S0
    carry_mask = torch.ones(NT + 1, NT, dtype=torch.bool, device=x.device).tril(-1)  # m < n
    carry = masked_decay(before[..., :, None] - before[..., None, 1:], carry_mask)  # [Bt, G, R, NT+1, NT]
    states = torch.einsum("bgrnm,bgrmsp->bgrnsp", carry, dS)  # [Bt, G, R, NT+1, N, P]
    if initial_state is not None:
        S0 = initial_state.to(x.dtype).reshape(Bt, G, R, 1, N, P)
        states = states + before.exp()[..., None, None] * S0
    y = y + (Cc * cum.exp()[..., None]) @ states[:, :, :, :NT]  # inter-chunk
    y = y.reshape(Bt, H, NT * L, P).transpose(1, 2)[:, :T]  # [Bt, T, H, P]
    return y, states[:, :, :, NT].reshape(Bt, H, N, P)
