"""Gated delta rule (GDN and KDA), the definition: one step per token (also the torch decode path).

S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T (scale q_t)

KDA's log decay g_t is a K-vector; GDN's is one number per head (g `[..., 1]`, broadcast over the K rows of S),
for which Diag(exp(g_t)) commutes with (I - beta_t k_t k_t^T): GDN's exp(g_t) (I - beta_t k_t k_t^T) S_{t-1}.
"""

from __future__ import annotations

import torch


def naive_recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step recurrence on equal-length sequences (q/k already per value head and normalised).

    Args:
        q, k: `[B, T, H, K]`. v: `[B, T, H, V]`. beta: `[B, T, H]`. All one float dtype.
        g: log decay, `[B, T, H, K]` per channel (KDA) or `[B, T, H, 1]` per head (GDN).
        scale: multiplies q.
        initial_state: `[B, H, K, V]` or None (zeros).

    Returns:
        o `[B, T, H, V]` and the final state `[B, H, K, V]`, in the inputs' dtype.
    """
    B, T, H, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    outputs = []
    for t in range(T):
        k_t = k[:, t]  # [B, H, K]
        S = S * g[:, t].exp()[..., None]  # Diag(exp(g_t)) S: row i of S decays by exp(g_t[i])
        error = v[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, S)  # [B, H, V]
        S = S + beta[:, t, :, None, None] * k_t[..., :, None] * error[..., None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, H, v.shape[-1])  # [B, T, H, V]
    return o, S
