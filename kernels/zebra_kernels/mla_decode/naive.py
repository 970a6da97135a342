"""The absorbed MLA decode attention in plain torch: the reference every backend is checked against (float64 in
the tests) and the CPU path."""

from __future__ import annotations

import torch


def visible_keys(lengths: torch.Tensor, T: int, L: int) -> torch.Tensor:
    """Bool `[B, T, L]`: key slot j is visible to new token t of row b when `j < lengths[b] - T + t + 1` (the
    cache holds `lengths[b]` tokens, the T new ones last, and attention is causal)."""
    limit = lengths.reshape(-1, 1) - T + 1 + torch.arange(T, device=lengths.device)  # [B or 1, T]
    return torch.arange(L, device=lengths.device) < limit[:, :, None]


def torch_mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of the absorbed queries over the latent cache, causal over the last T slots.

    Args:
        q_latent: `[B, T, H, R]` the no-RoPE query folded into latent space (`q_nope W_uk`).
        q_rope: `[B, T, H, dr]` the roped query part.
        latent: `[B, L, R]` the cached latents (L = the capacity; slots past the length are ignored).
        k_rope: `[B, L, dr]` the cached roped shared keys.
        lengths: `[B]` or 0-d integer tensor: cached tokens per row after the T new ones were written.
        scale: the softmax scale.

    Returns:
        `[B, T, H, R]` the attention output in latent space, in q_latent's dtype.
    """
    T, L = q_latent.shape[1], latent.shape[1]
    scores = torch.einsum("bthr,blr->bhtl", q_latent, latent.to(q_latent.dtype))  # [B, H, T, L]
    scores = scores + torch.einsum("bthd,bld->bhtl", q_rope, k_rope.to(q_rope.dtype))
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale
    visible = visible_keys(lengths.to(latent.device), T, L)[:, None]  # [B or 1, 1, T, L]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    out = torch.einsum("bhtl,blr->bthr", probs.to(latent.dtype), latent)  # [B, T, H, R]
    return out.to(q_latent.dtype)
