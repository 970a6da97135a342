"""Mamba2 SSD, the definition: one step per token (also the torch decode path).

S_t = exp(dt_t A) S_{t-1} + dt_t B_t x_t^T,    y_t = S_t^T C_t        (+ D x_t, added by the caller)
"""

from __future__ import annotations

import torch


def naive_recurrent_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step SSD on equal-length sequences, B/C already expanded to one row per head.

    Args:
        x: `[Bt, T, H, P]`. dt: `[Bt, T, H]` (> 0). A: `[H]` (< 0). B, C: `[Bt, T, H, N]`. One float dtype.
        initial_state: `[Bt, H, N, P]` or None (zeros).

    Returns:
        y `[Bt, T, H, P]` (without the D skip) and the final state `[Bt, H, N, P]`.
    """
    Bt, T, H, P = x.shape
    S = x.new_zeros(Bt, H, B.shape[-1], P) if initial_state is None else initial_state.to(x.dtype)
    outputs = []
    for t in range(T):
        dt_t = dt[:, t]  # [Bt, H]
        S = (dt_t * A).exp()[..., None, None] * S + dt_t[..., None, None] * B[:, t, :, :, None] * x[
            :, t, :, None, :
        ]
        outputs.append(torch.einsum("bhn,bhnp->bhp", C[:, t], S))
    y = torch.stack(outputs, dim=1) if outputs else x.new_zeros(Bt, 0, H, P)  # [Bt, T, H, P]
    return y, S
