"""`mamba2_ssd_step` as one Triton kernel (GPU; also runs under `TRITON_INTERPRET=1` on a CPU, as the tests do).

One program per (row b, head h, block of BLOCK_P head channels): it reads the head's state tile `[N, BLOCK_P]`
once, updates it in registers and writes it once; the step size, the decay, the group's B and C rows and the D
skip are scalars and vectors it computes on the way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zebra_kernels._common import on_device

# head channels per program: 4 programs per 64-channel head keep a batch-1 step spread over the SMs
BLOCK_P = 16
SOFTPLUS_THRESHOLD = 20.0  # F.softplus's: above it softplus(x) == x in float32


@triton.jit
def _ssd_step_kernel(
    x_ptr,  # [B, H, P], P contiguous
    dt_ptr,  # [B, H], H contiguous
    dt_bias_ptr,  # [H]
    A_ptr,  # [H]
    B_ptr,  # [B, G, N], N contiguous
    C_ptr,  # [B, G, N], B's strides
    D_ptr,  # [H] (unused without HAS_D)
    mask_ptr,  # [B] bool (unused without HAS_MASK)
    feed_ptr,  # 0-d bool (unused without HAS_FEED)
    state_ptr,  # [B, H, N, P] float32, contiguous (unused without HAS_STATE)
    new_state_ptr,  # [B, H, N, P] float32, contiguous: a new buffer, or state_ptr itself (in place)
    y_ptr,  # [B, H, P], contiguous
    H,
    N,
    P,
    heads_per_group,
    stride_x_b,
    stride_x_h,
    stride_dt_b,
    stride_bc_b,
    stride_bc_g,
    HAS_D: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_STATE: tl.constexpr,
    HAS_FEED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
    THRESHOLD: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)  # [BLOCK_P]
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    in_p = offs_p < P
    in_n = offs_n < N

    dt = tl.load(dt_ptr + b * stride_dt_b + h).to(tl.float32) + tl.load(dt_bias_ptr + h).to(tl.float32)
    step = tl.where(dt <= THRESHOLD, tl.log(1.0 + tl.exp(dt)), dt)  # softplus
    if HAS_MASK:
        step = tl.where(tl.load(mask_ptr + b) != 0, step, 0.0)  # a pad leaves the state as it was
    decay = tl.exp(step * tl.load(A_ptr + h).to(tl.float32))

    group = h // heads_per_group
    bc = b * stride_bc_b + group * stride_bc_g + offs_n
    B_row = tl.load(B_ptr + bc, mask=in_n, other=0.0).to(tl.float32)  # [BLOCK_N]
    C_row = tl.load(C_ptr + bc, mask=in_n, other=0.0).to(tl.float32)  # [BLOCK_N]
    x = tl.load(x_ptr + b * stride_x_b + h * stride_x_h + offs_p, mask=in_p, other=0.0).to(tl.float32)

    tile = ((b * H + h) * N + offs_n[:, None]) * P + offs_p[None, :]  # [BLOCK_N, BLOCK_P]
    in_tile = in_n[:, None] & in_p[None, :]
    S = (step * B_row)[:, None] * x[None, :]  # [BLOCK_N, BLOCK_P]
    if HAS_STATE:
        S += decay * tl.load(state_ptr + tile, mask=in_tile, other=0.0)
    if HAS_FEED:  # the tile was read above: writing it in place is safe
        # the flag broadcast to [BLOCK_P] (a block mask: Triton's interpreter takes no scalar one)
        feed = tl.load(feed_ptr + offs_p * 0) != 0
        tl.store(new_state_ptr + tile, S, mask=in_tile & feed[None, :])
    else:
        tl.store(new_state_ptr + tile, S, mask=in_tile)

    y = tl.sum(S * C_row[:, None], axis=0)  # [BLOCK_P]
    if HAS_D:
        y += tl.load(D_ptr + h).to(tl.float32) * x
    tl.store(y_ptr + (b * H + h) * P + offs_p, y.to(y_ptr.dtype.element_ty), mask=in_p)


def triton_ssd_step(x, dt, A, B, C, *, dt_bias, D=None, state=None, mask=None, inplace=False, feed=None):
    """`zebra_kernels.mamba2_ssd_step` (float32 math; shapes checked there) in one launch."""
    Bt, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    # strided views of the input projection (a decode step's x, dt, B and C) pass as they are
    x = x if x.stride(-1) == 1 else x.contiguous()
    dt = dt if dt.stride(-1) == 1 else dt.contiguous()
    if B.stride(-1) != 1 or B.stride() != C.stride():
        B, C = B.contiguous(), C.contiguous()
    mask = None if mask is None else mask.contiguous()  # one flag per row, read at row b
    if inplace:
        if state.dtype != torch.float32 or not state.is_contiguous():
            raise ValueError("mamba2_ssd_step: inplace needs a contiguous float32 state")
        new_state = state
    else:
        state = None if state is None else state.float().contiguous()  # a no-op for a float32 cache
        new_state = torch.empty(Bt, H, N, P, dtype=torch.float32, device=x.device)
    y = torch.empty(Bt, H, P, dtype=x.dtype, device=x.device)
    grid = (Bt, H, triton.cdiv(P, BLOCK_P))
    with on_device(x):
        _ssd_step_kernel[grid](
            x, dt, dt_bias, A, B, C,
            D if D is not None else dt_bias,  # a valid pointer the kernel never reads without HAS_D
            mask if mask is not None else dt,
            feed if feed is not None else dt,
            state if state is not None else new_state,
            new_state, y,
            H, N, P, H // G,
            x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1),
            HAS_D=D is not None,
            HAS_MASK=mask is not None,
            HAS_STATE=state is not None,
            HAS_FEED=inplace and feed is not None,
            BLOCK_N=triton.next_power_of_2(N),
            BLOCK_P=BLOCK_P,
            THRESHOLD=SOFTPLUS_THRESHOLD,
        )  # fmt: skip
    return y, new_state
