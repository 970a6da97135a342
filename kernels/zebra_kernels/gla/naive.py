"""Gated linear attention (GLA), the definition: one step per token (also the torch decode path).

S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T (scale q_t)

with one log decay g_t <= 0 per key channel (FLA's `naive_recurrent_gla`, here in the inputs' dtype).
"""

from __future__ import annotations

import torch


def naive_recurrent_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step recurrence on equal-length sequences.

    Args:
        q, k, g: `[B, T, H, K]` (g: the log decay per key channel). v: `[B, T, H, V]`. All one float dtype.
        scale: multiplies q.
        initial_state: `[B, H, K, V]` or None (zeros).

    Returns:
        o `[B, T, H, V]` and the final state `[B, H, K, V]`, in the inputs' dtype.
    """
    B, T, H, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    outputs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None] + k[:, t, :, :, None] * v[:, t, :, None, :]  # [B, H, K, V]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, H, v.shape[-1])  # [B, T, H, V]
    return o, S
