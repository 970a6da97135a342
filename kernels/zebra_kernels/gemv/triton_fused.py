"""The decode GEMVs of `zebra_kernels.gemv` as one Triton kernel (GPU; also under `TRITON_INTERPRET=1` on a CPU,
as the tests run it).

A decode step multiplies a few rows of activations (`R` <= `zebra_kernels.gemv.MAX_ROWS`) by every weight
matrix once: it is a read of the weights, and each matrix deserves the whole memory bandwidth. Each program owns
`BLOCK_N` output rows, walks K in blocks of `BLOCK_K` and keeps a float32 product per lane,
`[BLOCK_R, BLOCK_N, BLOCK_K]`, reduced over K once at the end; the weight tile is loaded once for every activation
row. There are enough programs (a few per SM, see `launch_config`) to keep loads in flight without a split-K
reduction; the block sizes and warps of each shape are timed once per process among a few candidates
(`tuned_config`), since the best differ between a 67 MB MLP and a 4 MB projection and between GPUs.

Prologue (NORM): the sublayer's pre-norm. Every program first sums the squares of its rows of
`s = x + residual` (the activations are a few KB, read from L2), then normalises each K block as it multiplies
it, rounding `h = s * rstd * norm_weight` to the activations' dtype exactly where the unfused path stores it.
Program 0 writes `s`, the residual stream, to a buffer of its own (never over an input another program reads).
Prologue (GATED): the recurrent mixers' gated output norm (`rms_norm_gated`), RMS over groups of `GROUP`
channels that each K block holds whole, the norm weight repeated every `norm_period` channels (per head for
GDN and KDA, whole for Mamba2), with the gate's SiLU or sigmoid before (Mamba2) or after (GDN, KDA) the norm.
Epilogue (SWIGLU): a second weight (`up`) read beside the first (`gate`), both outputs rounded to the output
dtype as the two GEMVs would store them, then `silu(gate) * up` in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zebra_kernels._common import on_device

PROGRAMS_PER_SM = 4  # enough weight loads in flight per SM without splitting K
INTERPRETER_SMS = 2  # the "SM count" under Triton's interpreter (a CPU)
TUNE_REPEATS = 10  # timed launches of each candidate config
MAX_TILE = 8192  # float32 accumulator lanes, [BLOCK_R, BLOCK_N, BLOCK_K]: 64 a thread at 4 warps


@triton.jit
def _gated_norm(
    x,  # [BLOCK_R, BLOCK_K] a block of the mixer's output
    z,  # [BLOCK_R, BLOCK_K] its gate
    norm_w,  # [BLOCK_K] the norm weight at these channels
    eps,
    GROUP: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr,
    SIGMOID: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """`rms_norm_gated` of one block holding whole groups, in float32: `[BLOCK_R, BLOCK_K]`."""
    z = z.to(tl.float32)
    if SIGMOID:
        act = tl.sigmoid(z)
    else:
        act = z * tl.sigmoid(z)
    s = x.to(tl.float32)
    if not NORM_BEFORE_GATE:
        s = s * act
    groups = tl.reshape(s, [BLOCK_R, BLOCK_K // GROUP, GROUP])
    rstd = 1.0 / tl.sqrt(tl.sum(groups * groups, axis=2) / GROUP + eps)  # [BLOCK_R, BLOCK_K // GROUP]
    s = tl.reshape(groups * rstd[:, :, None], [BLOCK_R, BLOCK_K]) * norm_w.to(tl.float32)[None, :]
    if NORM_BEFORE_GATE:
        s = s * act
    return s


@triton.jit
def _gemv_kernel(
    x_ptr,  # [R, K] rows contiguous, row stride stride_x
    residual_ptr,  # [R, K] contiguous (NORM and HAS_RESIDUAL)
    norm_weight_ptr,  # [K] (NORM)
    stream_ptr,  # [R, K] contiguous, out: x + residual in the stream's dtype (NORM and HAS_RESIDUAL)
    w_ptr,  # [N, K] row stride stride_w, columns contiguous
    up_ptr,  # [N, K] row stride stride_up (SWIGLU)
    gate_ptr,  # [R, K] columns contiguous, row stride stride_gate (GATED)
    y_ptr,  # [R, N] contiguous, out
    R,
    N,
    K,
    stride_x,
    stride_w,
    stride_up,
    stride_gate,
    norm_period,  # GATED: the norm weight's length C; channel k takes weight k % C
    eps,
    NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    SWIGLU: tl.constexpr,
    GATED: tl.constexpr,
    GROUP: tl.constexpr,  # GATED: channels per RMS group (a power of two dividing BLOCK_K and K)
    NORM_BEFORE_GATE: tl.constexpr,
    SIGMOID: tl.constexpr,  # GATED: the gate's activation is sigmoid (KDA), else SiLU
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows_r = tl.arange(0, BLOCK_R)  # [BLOCK_R] activation rows
    mask_r = rows_r < R
    rows_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output rows
    mask_n = rows_n < N
    cols = tl.arange(0, BLOCK_K)  # [BLOCK_K]

    if NORM:
        sum_sq = tl.zeros([BLOCK_R], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + cols
            mask = mask_r[:, None] & (k < K)[None, :]
            s = tl.load(x_ptr + rows_r[:, None] * stride_x + k[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                s += tl.load(residual_ptr + rows_r[:, None] * K + k[None, :], mask=mask, other=0.0).to(
                    tl.float32
                )
                if pid == 0:
                    tl.store(
                        stream_ptr + rows_r[:, None] * K + k[None, :],
                        s.to(stream_ptr.dtype.element_ty),
                        mask=mask,
                    )
            sum_sq += tl.sum(s * s, axis=1)
        rstd = 1.0 / tl.sqrt(sum_sq / K + eps)  # [BLOCK_R]

    # products summed per lane across the K blocks, reduced over K once after the loop (no shuffles per block)
    acc = tl.zeros([BLOCK_R, BLOCK_N, BLOCK_K], dtype=tl.float32)
    if SWIGLU:
        acc_up = tl.zeros([BLOCK_R, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + cols
        mask_k = k < K
        mask = mask_r[:, None] & mask_k[None, :]
        h = tl.load(
            x_ptr + rows_r[:, None] * stride_x + k[None, :], mask=mask, other=0.0
        )  # [BLOCK_R, BLOCK_K]
        if NORM:
            s = h.to(tl.float32)
            if HAS_RESIDUAL:
                s += tl.load(residual_ptr + rows_r[:, None] * K + k[None, :], mask=mask, other=0.0).to(
                    tl.float32
                )
            norm_w = tl.load(norm_weight_ptr + k, mask=mask_k, other=0.0).to(tl.float32)
            h = (s * rstd[:, None] * norm_w[None, :]).to(x_ptr.dtype.element_ty)  # what the norm would store
        if GATED:
            z = tl.load(gate_ptr + rows_r[:, None] * stride_gate + k[None, :], mask=mask, other=0.0)
            norm_w = tl.load(norm_weight_ptr + k % norm_period, mask=mask_k, other=0.0)
            s = _gated_norm(h, z, norm_w, eps, GROUP, NORM_BEFORE_GATE, SIGMOID, BLOCK_R, BLOCK_K)
            h = s.to(x_ptr.dtype.element_ty)  # what the gated norm would store
        h = h.to(tl.float32)
        w_mask = mask_n[:, None] & mask_k[None, :]
        w = tl.load(w_ptr + rows_n[:, None] * stride_w + k[None, :], mask=w_mask, other=0.0).to(tl.float32)
        acc += h[:, None, :] * w[None, :, :]  # [BLOCK_R, BLOCK_N, BLOCK_K]
        if SWIGLU:
            u = tl.load(up_ptr + rows_n[:, None] * stride_up + k[None, :], mask=w_mask, other=0.0).to(
                tl.float32
            )
            acc_up += h[:, None, :] * u[None, :, :]

    out = tl.sum(acc, axis=2).to(y_ptr.dtype.element_ty)  # [BLOCK_R, BLOCK_N]
    if SWIGLU:
        gate = out.to(tl.float32)
        up = tl.sum(acc_up, axis=2).to(y_ptr.dtype.element_ty).to(tl.float32)
        out = (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty)
    y_mask = mask_r[:, None] & mask_n[None, :]
    tl.store(y_ptr + rows_r[:, None] * N + rows_n[None, :], out, mask=y_mask)


def launch_config(rows: int, n: int, k: int, sms: int, accumulators: int = 1) -> tuple[int, int, int, int]:
    """(BLOCK_R, BLOCK_N, BLOCK_K, num_warps) before tuning, for `rows` activation rows and an `[n, k]` weight on
    `sms` SMs (`accumulators`: 2 with SwiGLU's up weight): the widest block of output rows (1 to 16) that still
    gives `PROGRAMS_PER_SM` programs per SM, and K in blocks of up to 512 columns, fewer where the accumulator
    lanes would pass `MAX_TILE`."""
    block_r = triton.next_power_of_2(rows)
    block_n = 16
    while block_n > 1 and triton.cdiv(n, block_n) < PROGRAMS_PER_SM * sms:
        block_n //= 2
    block_k = max(64, min(512, triton.next_power_of_2(k), MAX_TILE // (accumulators * block_r * block_n)))
    return block_r, block_n, block_k, 4


def candidates(rows: int, n: int, k: int, sms: int, accumulators: int = 1) -> list[tuple[int, int, int, int]]:
    """What `tuned_config` times (at most 8, each a compile the first time on a machine): `launch_config`'s
    choice, twice its K block, twice its output rows, half its rows over twice its K block; 4 and 8 warps each;
    none with more than twice `MAX_TILE` accumulator lanes (128 registers a thread at 4 warps)."""
    block_r, block_n, block_k, _ = launch_config(rows, n, k, sms, accumulators)
    shapes = [(block_n, block_k), (block_n, 2 * block_k), (2 * block_n, block_k), (block_n // 2, 2 * block_k)]
    found = []
    for bn, bk in shapes:
        lanes = accumulators * block_r * bn * bk
        fits = 1 <= bn <= 16 and bk <= triton.next_power_of_2(k) and lanes <= 2 * MAX_TILE
        for warps in (4, 8):
            if fits and (block_r, bn, bk, warps) not in found:
                found.append((block_r, bn, bk, warps))
    return found


_tuned: dict[tuple, tuple[int, int, int, int]] = {}


def tuned_config(key: tuple, launch, rows: int, n: int, k: int, accumulators: int, device: torch.device):
    """The fastest of `candidates` for this shape and kind of launch, timed once per process on the GPU (CUDA
    events, after a compile-and-warm run of each); `launch_config` on a CPU or while a CUDA graph is captured
    (the engine's eager warm-up steps tune before its capture)."""
    if key in _tuned:
        return _tuned[key]
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return launch_config(rows, n, k, _sm_count(device), accumulators)
    timings = []
    for config in candidates(rows, n, k, _sm_count(device), accumulators):
        launch(config)  # compile, warm
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(TUNE_REPEATS):
            launch(config)
        end.record()
        end.synchronize()
        timings.append((start.elapsed_time(end), config))
    _tuned[key] = min(timings)[1]
    return _tuned[key]


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def triton_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    up_weight: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    gate: torch.Tensor | None = None,
    group_size: int = 0,
    norm_before_gate: bool = True,
    sigmoid: bool = False,
    config: tuple[int, int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(y [R, N], stream [R, K] or None)` for `x [R, K]`; see `zebra_kernels.gemv` for what each argument adds
    (`gate` `[R, K]` with `norm_weight`: the gated norm, in groups of `group_size`, a power of two dividing K).
    `config` (BLOCK_R, BLOCK_N, BLOCK_K, num_warps) overrides the tuned one (benchmarks, tests)."""
    rows, k = x.shape
    n = weight.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if gate is not None and gate.stride(-1) != 1:
        gate = gate.contiguous()
    if weight.stride(-1) != 1 or (up_weight is not None and up_weight.stride(-1) != 1):
        raise ValueError("the weights' columns must be contiguous")
    gated = gate is not None
    norm = norm_weight is not None and not gated
    has_residual = norm and residual is not None
    if has_residual:
        residual = residual.contiguous()
    swiglu = up_weight is not None
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    stream = torch.empty(rows, k, device=x.device, dtype=residual.dtype) if has_residual else None

    def launch(cfg: tuple[int, int, int, int]) -> None:
        block_r, block_n, block_k, warps = cfg
        block_k = max(block_k, group_size) if gated else block_k  # a K block holds whole groups
        with on_device(x):
            _gemv_kernel[(triton.cdiv(n, block_n),)](
                x,
                residual if has_residual else x,
                norm_weight if norm_weight is not None else x,
                stream if has_residual else y,
                weight,
                up_weight if swiglu else weight,
                gate if gated else x,
                y,
                rows,
                n,
                k,
                x.stride(0),
                weight.stride(0),
                up_weight.stride(0) if swiglu else 0,
                gate.stride(0) if gated else 0,
                norm_weight.shape[0] if gated else 1,
                eps,
                NORM=norm,
                HAS_RESIDUAL=has_residual,
                SWIGLU=swiglu,
                GATED=gated,
                GROUP=group_size if gated else 1,
                NORM_BEFORE_GATE=norm_before_gate,
                SIGMOID=sigmoid,
                BLOCK_R=block_r,
                BLOCK_N=block_n,
                BLOCK_K=block_k,
                num_warps=warps,
            )

    if config is None:
        key = (x.device, x.dtype, weight.dtype, rows, n, k, norm, has_residual, swiglu, gated, group_size)
        config = tuned_config(key, launch, rows, n, k, 1 + swiglu, x.device)
    launch(config)
    return y, stream
