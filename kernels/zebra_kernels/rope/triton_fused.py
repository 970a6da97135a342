"""MLA's two rotary embeddings (the per-head query part and the shared key) in one Triton launch (GPU; also under
`TRITON_INTERPRET=1` on a CPU, as the tests run it).

One program per token: it loads the token's cos/sin once, rotates its H query heads and its shared key (pairs
(2i, 2i+1) by angle i, float32 math, output de-interleaved as `torch_rotate_pairs`) and writes both contiguous. The
torch form is seven elementwise launches per tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zebra_kernels._common import on_device


@triton.jit
def _rope_kernel(
    q_ptr,  # [B, T, H, D], last dim contiguous
    k_ptr,  # [B, T, D], last dim contiguous
    cos_ptr,  # [B or 1, T, D / 2], last dim contiguous
    sin_ptr,
    q_out_ptr,  # [B, T, H, D] contiguous
    k_out_ptr,  # [B, T, D] contiguous
    T,
    H,
    stride_q_b,
    stride_q_t,
    stride_q_h,
    stride_k_b,
    stride_k_t,
    stride_cs_b,  # 0 when cos/sin are shared by the rows
    stride_cs_t,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bt = tl.program_id(0)
    b, t = bt // T, bt % T
    i = tl.arange(0, BLOCK_D)  # pair index
    i_ok = i < HALF
    cs = b * stride_cs_b + t * stride_cs_t + i
    cos = tl.load(cos_ptr + cs, mask=i_ok, other=0.0).to(tl.float32)[None, :]  # [1, BLOCK_D]
    sin = tl.load(sin_ptr + cs, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    # rows 0..H-1 are the query heads, row H the shared key
    r = tl.arange(0, BLOCK_H)
    is_q = r < H
    row_ok = r <= H
    src = tl.where(is_q, b * stride_q_b + t * stride_q_t + r * stride_q_h, b * stride_k_b + t * stride_k_t)
    tile_ok = row_ok[:, None] & i_ok[None, :]
    even_q = tl.load(q_ptr + src[:, None] + 2 * i[None, :], mask=tile_ok & is_q[:, None], other=0.0)
    odd_q = tl.load(q_ptr + src[:, None] + 2 * i[None, :] + 1, mask=tile_ok & is_q[:, None], other=0.0)
    k_row = tile_ok & (r == H)[:, None]
    even = tl.where(
        is_q[:, None], even_q, tl.load(k_ptr + src[:, None] + 2 * i[None, :], mask=k_row, other=0.0)
    )
    odd = tl.where(
        is_q[:, None], odd_q, tl.load(k_ptr + src[:, None] + 2 * i[None, :] + 1, mask=k_row, other=0.0)
    )
    even, odd = even.to(tl.float32), odd.to(tl.float32)
    first = (even * cos - odd * sin).to(q_out_ptr.dtype.element_ty)  # [BLOCK_H, BLOCK_D]
    second = (odd * cos + even * sin).to(q_out_ptr.dtype.element_ty)
    q_dst = (bt * H + r) * (2 * HALF)  # [BLOCK_H]
    q_tile = tile_ok & is_q[:, None]
    tl.store(q_out_ptr + q_dst[:, None] + i[None, :], first, mask=q_tile)
    tl.store(q_out_ptr + q_dst[:, None] + HALF + i[None, :], second, mask=q_tile)
    k_dst = bt * (2 * HALF) + i[None, :] + 0 * r[:, None]  # [BLOCK_H, BLOCK_D], only row H stored
    tl.store(k_out_ptr + k_dst, first, mask=k_row)
    tl.store(k_out_ptr + k_dst + HALF, second, mask=k_row)


def triton_rope_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch_rotate_pairs` of q `[B, T, H, D]` (cos/sin `[B or 1, T, 1, D / 2]` there) and k `[B, T, D]` (cos/sin
    `[B or 1, T, D / 2]`) in one launch; cos and sin are passed `[B or 1, T, D / 2]`. Returns new contiguous
    tensors in q's and k's dtype (which must match)."""
    B, T, H, D = q.shape
    q, k, cos, sin = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, cos, sin))
    q_out, k_out = (
        torch.empty(B, T, H, D, dtype=q.dtype, device=q.device),
        torch.empty_like(k, memory_format=torch.contiguous_format),
    )
    stride_cs_b = 0 if cos.shape[0] == 1 else cos.stride(0)
    with on_device(q):
        _rope_kernel[(B * T,)](
            q, k, cos, sin, q_out, k_out, T, H, *q.stride()[:3], *k.stride()[:2], stride_cs_b, cos.stride(1),
            HALF=D // 2, BLOCK_H=triton.next_power_of_2(H + 1), BLOCK_D=triton.next_power_of_2(D // 2), num_warps=1,
        )  # fmt: skip
    return q_out, k_out
