"""One Mamba2 decode step with everything around the state update in the same op: the step size
`softplus(dt + dt_bias)` (0 at pads), the decay, the grouped B/C, the state update, the C readout and the D skip.

On a GPU this is one Triton launch (`zebra_kernels.mamba2.triton_step`) where the scan path runs about a dozen
small kernels per Mamba2 sublayer and token (casts, softplus, B/C repeats, x * dt, the recurrent kernel, the D
skip); the torch form is `naive_recurrent_ssd` for one token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zebra_kernels._common import check_state, compute_dtype, store_state_
from zebra_kernels.backend import resolve_backend
from zebra_kernels.mamba2.naive import naive_recurrent_ssd


def mamba2_ssd_step(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    dt_bias: torch.Tensor,
    D: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    inplace: bool = False,
    feed: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""One token of Mamba2: `mamba2_ssd` at T = 1 with the step size computed inside.

    `s = softplus(dt + dt_bias)` (0 where `mask` is False), `S' = exp(s A) S + s B x^T`, `y = S'^T C + D x`.

    Args:
        x: `[B, H, P]`, the conv output of this token.
        dt: `[B, H]`, the raw step projection (before `dt_bias` and softplus).
        A: `[H]`, negative. B, C: `[B, G, N]` (head h reads group `h // (H // G)`).
        dt_bias: `[H]`. D: `[H]` or None.
        state: `[B, H, N, P]` or None (zeros); not modified unless `inplace`.
        mask: `[B]` bool, False for a pad token (its state passes through unchanged), or None.
        inplace: write the new state into `state` (a static cache's float32 buffer) and return it.
        feed: with `inplace`, a 0-d bool tensor: False leaves `state` as it was (a static `ZebraCache`'s flag).
        backend: "torch", or "auto" / "fla" / "mamba_ssm": one Triton launch on a GPU (the torch form elsewhere
            for "auto").

    Returns:
        y `[B, H, P]` in x's dtype and the new state `[B, H, N, P]` (float32; float64 for float64 inputs).

    Examples:
        >>> Bt, H, P, G, N = 2, 4, 8, 2, 16
        >>> y, S = mamba2_ssd_step(torch.randn(Bt, H, P), torch.randn(Bt, H), -torch.rand(H),
        ...                        torch.randn(Bt, G, N), torch.randn(Bt, G, N), dt_bias=torch.zeros(H))
        >>> y.shape, S.shape
        (torch.Size([2, 4, 8]), torch.Size([2, 4, 16, 8]))
    """
    Bt, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    if tuple(dt.shape) != (Bt, H) or B.shape != C.shape or B.shape[0] != Bt or H % G:
        raise ValueError(
            f"mamba2_ssd_step: x [B, H, P] = {list(x.shape)} needs dt [B, H], B and C [B, G, N] with H a "
            f"multiple of G; got dt {list(dt.shape)}, B {list(B.shape)}, C {list(C.shape)}"
        )
    check_state(state, (Bt, H, N, P), name="state")
    if inplace and (state is None or state.dtype not in (torch.float32, torch.float64)):
        raise ValueError("mamba2_ssd_step: inplace needs a float32 (or float64) state to write into")
    dtype = compute_dtype(x, dt, A, B, C, D, dt_bias, state)
    if dtype == torch.float32 and resolve_backend(backend, x.device) != "torch":
        from zebra_kernels.mamba2.triton_step import triton_ssd_step

        return triton_ssd_step(
            x, dt, A, B, C, dt_bias=dt_bias, D=D, state=state, mask=mask, inplace=inplace, feed=feed
        )
    y, new_state = torch_ssd_step(x, dt, A, B, C, dt_bias=dt_bias, D=D, state=state, mask=mask)
    return y, store_state_(state, new_state, feed) if inplace else new_state


def torch_ssd_step(x, dt, A, B, C, *, dt_bias, D=None, state=None, mask=None):
    """`mamba2_ssd_step` in torch: the step size, then `naive_recurrent_ssd` for one token, then the D skip."""
    dtype = compute_dtype(x, dt, A, B, C, D, dt_bias, state)
    step = F.softplus(dt.to(dtype) + dt_bias.to(dtype))  # [B, H]
    if mask is not None:
        step = step.masked_fill(~mask[:, None], 0.0)
    R = x.shape[1] // B.shape[1]  # heads per group
    xs = x.to(dtype)[:, None]  # [B, 1, H, P]
    y, S = naive_recurrent_ssd(
        xs,
        step[:, None],
        A.to(dtype),
        B.to(dtype).repeat_interleave(R, 1)[:, None],
        C.to(dtype).repeat_interleave(R, 1)[:, None],
        state,
    )  # [B, 1, H, P], [B, H, N, P]
    if D is not None:
        y = y + D.to(dtype)[:, None] * xs
    return y[:, 0].to(x.dtype), S
