"""The absorbed MLA decode attention as two Triton kernels (split-K, flash-decoding style), reading only the
cached tokens: the lengths are a device tensor, so a captured CUDA graph replays at any length.

Rows are the (new token, head) pairs of one batch row, `T * H` of them; every head reads the same latent cache,
so one program computes a block of rows against one block of cached tokens at a time (the latent is read once per
block of rows, as in FlashMLA). The keys of a row are split over `S` programs (fixed at launch from the capacity
and the GPU's size); each program takes an equal share of the *real* length (computed in the kernel from the
device length, in whole blocks of at least `MIN_CHUNK` tokens), so the work and the bytes read follow the cached
tokens, not the capacity, and a program past the length writes an empty partial. The second kernel merges the
partials of the splits that hold keys (log-sum-exp weights).

Partials: `acc [B, S, ROWS, R]` (unnormalised, float32) and `m, l [B, S, ROWS]` (running max in log2 units and
the softmax denominator).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zebra_kernels._common import on_device

BLOCK_N = 64  # cached tokens per inner step
MIN_CHUNK = 128  # the fewest tokens a split takes (fewer splits, fewer partials, at short lengths)
MAX_SPLITS = 64  # partials of 64 splits: 1 MB at 32 rows x 128 latent channels, against 10 MB of 32k latents
LOG2E = 1.4426950408889634


@triton.jit
def _split_kernel(
    ql_ptr,  # [B, T, H, R], last dim contiguous (the absorbing einsum's strided output is read as it is)
    qr_ptr,  # [B, T, H, DR], last dim contiguous
    lat_ptr,  # [B, L, R], last dim contiguous
    kr_ptr,  # [B, L, DR], last dim contiguous
    len_ptr,  # [B] or 0-d integer (stride_len 0)
    acc_ptr,  # [B, S, ROWS, R] float32
    ml_ptr,  # [B, S, ROWS, 2] float32: (max in log2 units, denominator)
    ROWS,
    H,
    T,
    R,
    DR,
    S,
    scale_log2,
    stride_ql_b,
    stride_ql_t,
    stride_ql_h,
    stride_qr_b,
    stride_qr_t,
    stride_qr_h,
    stride_lat_b,
    stride_lat_l,
    stride_kr_b,
    stride_kr_l,
    stride_len,
    IEEE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
):
    b = tl.program_id(0)
    row_block = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(len_ptr + b * stride_len).to(tl.int32)
    chunk = tl.maximum(tl.cdiv(tl.cdiv(length, S), BLOCK_N) * BLOCK_N, MIN_CHUNK)
    start = split * chunk
    end = tl.minimum(start + chunk, length)

    rows = row_block * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    row_ok = rows < ROWS
    limit = length - T + rows // H + 1  # [BLOCK_H]: keys < limit are visible to the row's token
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_DR)
    r_ok = offs_r < R
    d_ok = offs_d < DR
    t, h = rows // H, rows % H
    ql_rows = b * stride_ql_b + t * stride_ql_t + h * stride_ql_h  # [BLOCK_H]
    qr_rows = b * stride_qr_b + t * stride_qr_t + h * stride_qr_h
    q_lat = tl.load(
        ql_ptr + ql_rows[:, None] + offs_r[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0
    )  # [BLOCK_H, BLOCK_R]
    q_rope = tl.load(
        qr_ptr + qr_rows[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0
    )  # [BLOCK_H, BLOCK_DR]

    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    den = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        k_ok = keys < end
        lat = tl.load(
            lat_ptr + b * stride_lat_b + keys[:, None] * stride_lat_l + offs_r[None, :],
            mask=k_ok[:, None] & r_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_R]
        k_rope = tl.load(
            kr_ptr + b * stride_kr_b + keys[:, None] * stride_kr_l + offs_d[None, :],
            mask=k_ok[:, None] & d_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_DR]
        lat = lat.to(q_lat.dtype)
        if IEEE:
            s = tl.dot(q_lat, tl.trans(lat), input_precision="ieee")
            s += tl.dot(q_rope, tl.trans(k_rope.to(q_rope.dtype)), input_precision="ieee")
        else:
            s = tl.dot(q_lat, tl.trans(lat))
            s += tl.dot(q_rope, tl.trans(k_rope.to(q_rope.dtype)))
        s = tl.where(keys[None, :] < limit[:, None], s * scale_log2, float("-inf"))  # [BLOCK_H, BLOCK_N]
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no visible key yet
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        den = den * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(lat.dtype), lat, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(lat.dtype), lat)
        m = m_new

    part = (b * S + split) * ROWS + rows  # [BLOCK_H]
    tl.store(acc_ptr + part[:, None] * R + offs_r[None, :], acc, mask=row_ok[:, None] & r_ok[None, :])
    tl.store(ml_ptr + part * 2, m, mask=row_ok)
    tl.store(ml_ptr + part * 2 + 1, den, mask=row_ok)


@triton.jit
def _combine_kernel(
    acc_ptr,  # [B, S, ROWS, R] float32
    ml_ptr,  # [B, S, ROWS, 2] float32
    len_ptr,
    out_ptr,  # [B, ROWS, R] contiguous
    ROWS,
    R,
    S,
    stride_len,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.program_id(1)
    length = tl.load(len_ptr + b * stride_len).to(tl.int32)
    chunk = tl.maximum(tl.cdiv(tl.cdiv(length, S), BLOCK_N) * BLOCK_N, MIN_CHUNK)
    active = tl.cdiv(length, chunk)  # splits that hold keys; the others wrote nothing worth reading
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    offs_s = tl.arange(0, BLOCK_S)
    top = tl.full([], float("-inf"), dtype=tl.float32)
    for s0 in range(0, active, BLOCK_S):  # the largest max over the active splits
        s_ok = s0 + offs_s < active
        m = tl.load(ml_ptr + ((b * S + s0 + offs_s) * ROWS + row) * 2, mask=s_ok, other=float("-inf"))
        top = tl.maximum(top, tl.max(m, axis=0))
    top = tl.where(top == float("-inf"), 0.0, top)
    den = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for s0 in range(0, active, BLOCK_S):
        s_ok = s0 + offs_s < active
        part = (b * S + s0 + offs_s) * ROWS + row  # [BLOCK_S]
        m = tl.load(ml_ptr + part * 2, mask=s_ok, other=float("-inf"))
        weight = tl.exp2(m - top)  # [BLOCK_S], 0 for an empty split
        den += tl.sum(tl.load(ml_ptr + part * 2 + 1, mask=s_ok, other=0.0) * weight, axis=0)
        a = tl.load(
            acc_ptr + part[:, None] * R + offs_r[None, :], mask=s_ok[:, None] & r_ok[None, :], other=0.0
        )
        acc += tl.sum(a * weight[:, None], axis=0)
    out = acc / den
    tl.store(out_ptr + (b * ROWS + row) * R + offs_r, out.to(out_ptr.dtype.element_ty), mask=r_ok)


def num_splits(batch: int, row_blocks: int, capacity: int, device: torch.device) -> int:
    """Splits per (batch row, block of rows): enough programs for two waves over the GPU's multiprocessors,
    at most `MAX_SPLITS` and no more than the capacity has `MIN_CHUNK` blocks. Fixed for a cache, whatever the
    length (a CUDA graph replays the same launch)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    waves = triton.cdiv(2 * sms, batch * row_blocks)
    return max(1, min(MAX_SPLITS, triton.cdiv(capacity, MIN_CHUNK), waves))


def triton_mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    splits: int | None = None,
) -> torch.Tensor:
    """`torch_mla_decode` (same arguments) as the split and combine kernels; `splits` overrides `num_splits`."""
    B, T, H, R = q_latent.shape
    L, DR = latent.shape[1], k_rope.shape[2]
    ROWS = T * H
    q_latent, q_rope, latent, k_rope = (
        x if x.stride(-1) == 1 else x.contiguous() for x in (q_latent, q_rope, latent, k_rope)
    )
    lengths = lengths.to(device=latent.device)
    stride_len = 0 if lengths.dim() == 0 else lengths.stride(0)
    block_h = max(16, min(64, triton.next_power_of_2(ROWS)))
    row_blocks = triton.cdiv(ROWS, block_h)
    S = splits or num_splits(B, row_blocks, L, latent.device)
    acc = torch.empty(B, S, ROWS, R, dtype=torch.float32, device=latent.device)
    ml = torch.empty(B, S, ROWS, 2, dtype=torch.float32, device=latent.device)
    out = torch.empty(B, T, H, R, dtype=q_latent.dtype, device=latent.device)
    block_r, block_dr = max(16, triton.next_power_of_2(R)), max(16, triton.next_power_of_2(DR))
    with on_device(latent):
        _split_kernel[(B, row_blocks, S)](
            q_latent, q_rope, latent, k_rope, lengths, acc, ml, ROWS, H, T, R, DR, S, scale * LOG2E,
            *q_latent.stride()[:3], *q_rope.stride()[:3], latent.stride(0), latent.stride(1), k_rope.stride(0),
            k_rope.stride(1), stride_len,
            IEEE=q_latent.dtype == torch.float32, BLOCK_H=block_h, BLOCK_N=BLOCK_N, BLOCK_R=block_r,
            BLOCK_DR=block_dr, MIN_CHUNK=MIN_CHUNK, num_warps=4,
        )  # fmt: skip
        _combine_kernel[(B, ROWS)](
            acc, ml, lengths, out, ROWS, R, S, stride_len, BLOCK_S=16, BLOCK_R=block_r, BLOCK_N=BLOCK_N,
            MIN_CHUNK=MIN_CHUNK, num_warps=2,
        )  # fmt: skip
    return out
