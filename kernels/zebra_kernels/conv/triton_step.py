"""`causal_conv1d_step_` as one Triton kernel (GPU; also under `TRITON_INTERPRET=1` on a CPU, as the tests run it).

One program per (row, block of channels): it loads the channels' last W inputs shifted by one with this token
appended (the rolled window `[BLOCK_C, W]`), writes the window back in place (where `feed`), and returns
`act(sum(window * weight) + bias)`. Programs own disjoint channel rows, so reading and writing one buffer is safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zebra_kernels._common import on_device

# channels per program: 16 (24) per row for the 2,048 (3,072) conv channels of 1b-gdn-pure (1b-mamba-mla)
BLOCK_C = 128


@triton.jit
def _conv_step_kernel(
    x_ptr,  # [B, C], C contiguous
    weight_ptr,  # [C, W] contiguous
    bias_ptr,  # [C] (unused without HAS_BIAS)
    state_ptr,  # [B, C, W] contiguous, rolled in place
    feed_ptr,  # 0-d bool (unused without HAS_FEED)
    y_ptr,  # [B, C] contiguous
    C,
    W,
    stride_x_b,
    HAS_BIAS: tl.constexpr,
    HAS_FEED: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BLOCK_C]
    offs_w = tl.arange(0, BLOCK_W)  # [BLOCK_W]
    in_c = offs_c < C
    in_tile = in_c[:, None] & (offs_w[None, :] < W)
    rows = (b * C + offs_c[:, None]) * W  # [BLOCK_C, 1]

    x = tl.load(x_ptr + b * stride_x_b + offs_c, mask=in_c, other=0.0)  # [BLOCK_C]
    older = tl.load(
        state_ptr + rows + offs_w[None, :] + 1, mask=in_tile & (offs_w[None, :] + 1 < W), other=0.0
    )
    window = tl.where(offs_w[None, :] == W - 1, x[:, None].to(older.dtype), older)  # [BLOCK_C, BLOCK_W]
    weight = tl.load(weight_ptr + offs_c[:, None] * W + offs_w[None, :], mask=in_tile, other=0.0)
    y = tl.sum(window.to(tl.float32) * weight.to(tl.float32), axis=1)  # [BLOCK_C]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_c, mask=in_c, other=0.0).to(tl.float32)
    if SILU:
        y = y * tl.sigmoid(y)
    tl.store(y_ptr + b * C + offs_c, y.to(y_ptr.dtype.element_ty), mask=in_c)
    if HAS_FEED:
        # the flag broadcast to [BLOCK_C] (a block mask: Triton's interpreter takes no scalar one)
        feed = tl.load(feed_ptr + offs_c * 0) != 0
        in_tile = in_tile & feed[:, None]
    tl.store(state_ptr + rows + offs_w[None, :], window, mask=in_tile)


def triton_conv_step_(x, weight, bias, *, state, feed=None, activation="silu"):
    """`zebra_kernels.causal_conv1d_step_` (shapes checked there) in one launch."""
    B, C = x.shape
    W = weight.shape[1]
    if not state.is_contiguous():
        raise ValueError("causal_conv1d_step_: the state must be contiguous (it is updated in place)")
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight.contiguous()
    y = torch.empty(B, C, dtype=x.dtype, device=x.device)
    with on_device(x):
        _conv_step_kernel[(B, triton.cdiv(C, BLOCK_C))](
            x, weight, bias if bias is not None else weight, state, feed if feed is not None else state, y,
            C, W, x.stride(0),
            HAS_BIAS=bias is not None,
            HAS_FEED=feed is not None,
            SILU=activation in ("silu", "swish"),
            BLOCK_C=BLOCK_C,
            BLOCK_W=triton.next_power_of_2(W),
        )  # fmt: skip
    return y
