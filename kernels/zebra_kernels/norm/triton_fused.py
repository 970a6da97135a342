"""`rms_norm` with its residual add, forward and backward, as two Triton kernels (GPU; also under
`TRITON_INTERPRET=1` on a CPU, as the tests run them): the pre-norms of every sublayer in training.

Why not FLA's: its backward (`layer_norm_bwd_kernel_row`) runs one program per SM, each walking its rows one
at a time, so at most 8 warps per SM have loads in flight, and it takes several times what its bytes need
(docs/kernels.md, "The pre-norm and the MLP", has the figures). Here the backward runs `PROGRAMS_PER_SM`
programs per SM, each over a strided share of the rows with its own float32 row of the weight gradient (summed
after); the forward runs one program per row.

Forward, row t: `s = x + residual` (float32), stored in residual's dtype; `rstd = 1 / sqrt(mean(s^2) + eps)`;
`y = s * rstd * weight` in x's dtype. Backward: with `g = dy * weight` and `c = mean(s * rstd * g)`,
`ds = (g - s * rstd * c) * rstd + ds_out` goes to both x and residual, and `dweight = sum_t dy * s * rstd`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zebra_kernels._common import on_device

PROGRAMS_PER_SM = 8  # backward programs per SM; each keeps one row of loads in flight at a time
INTERPRETER_SMS = 2  # the "SM count" under Triton's interpreter (a CPU)


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr,  # [T, D] contiguous
    residual_ptr,  # [T, D] contiguous (unused without HAS_RESIDUAL)
    weight_ptr,  # [D] (unused without HAS_WEIGHT)
    y_ptr,  # [T, D] in x's dtype
    s_ptr,  # [T, D] in residual's dtype: x + residual (unused without HAS_RESIDUAL)
    rstd_ptr,  # [T] float32
    D,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    s = tl.load(x_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_D]
    if HAS_RESIDUAL:
        s += tl.load(residual_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(s_ptr + row * D + offs, s.to(s_ptr.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / D + eps)
    tl.store(rstd_ptr + row, rstd)
    y = s * rstd
    if HAS_WEIGHT:
        y *= tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * D + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr,  # [T, D] contiguous
    ds_ptr,  # [T, D] contiguous: the gradient of the returned sum s (unused without HAS_DS)
    s_ptr,  # [T, D] contiguous: what was normalised (x + residual, or x)
    weight_ptr,  # [D] (unused without HAS_WEIGHT)
    rstd_ptr,  # [T] float32
    dx_ptr,  # [T, D] in x's dtype
    dr_ptr,  # [T, D] in residual's dtype (unused without STORE_DR)
    dw_ptr,  # [programs, D] float32: each program's share of the weight gradient (unused without HAS_WEIGHT)
    T,
    D,
    HAS_DS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    STORE_DR: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_D]
        dw = tl.zeros([BLOCK_D], dtype=tl.float32)
    for row in range(pid, T, programs):
        base = tl.cast(row, tl.int64) * D  # [T, D] may pass 2^31 elements
        s = tl.load(s_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        s_hat = s * rstd
        g = dy
        if HAS_WEIGHT:
            g = dy * w
            dw += dy * s_hat
        c = tl.sum(s_hat * g, axis=0) / D
        ds = (g - s_hat * c) * rstd
        if HAS_DS:
            ds += tl.load(ds_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + base + offs, ds.to(dx_ptr.dtype.element_ty), mask=mask)
        if STORE_DR:
            tl.store(dr_ptr + base + offs, ds.to(dr_ptr.dtype.element_ty), mask=mask)
    if HAS_WEIGHT:
        tl.store(dw_ptr + pid * D + offs, dw, mask=mask)


def _launch_options(D: int) -> tuple[int, int]:
    """(BLOCK_D, num_warps) for rows of D channels: all of a row in one block."""
    block = triton.next_power_of_2(D)
    return block, min(max(block // 256, 1), 8)


def _programs(device: torch.device, T: int) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = INTERPRETER_SMS
    return max(min(T, sms * PROGRAMS_PER_SM), 1)


class TritonRMSNorm(torch.autograd.Function):
    """(y, s) = rms_norm(x + residual) and the sum, on the two kernels above; s is empty without a residual."""

    # The outputs are allocated in their final shapes and returned as they are, never as views of a [T, D]
    # buffer: under torch.compile (AOTAutograd), a view of an output also saved for backward can come back as
    # its flat [T, D] base, which the next sublayer's norm refuses (docs/benchmarks.md, `train.compile`).
    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        D = x.shape[-1]
        x2 = x.reshape(-1, D).contiguous()  # [T, D]
        r2 = None if residual is None else residual.reshape(-1, D).contiguous()
        T = x2.shape[0]
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [..., D] contiguous: rows of [T, D]
        s = x2 if r2 is None else torch.empty(residual.shape, dtype=residual.dtype, device=x.device)
        rstd = torch.empty(T, dtype=torch.float32, device=x.device)
        block, warps = _launch_options(D)
        if T:
            with on_device(x2):
                _rms_norm_fwd_kernel[(T,)](
                    x2, x2 if r2 is None else r2, x2 if weight is None else weight, y, s, rstd, D, eps,
                    HAS_RESIDUAL=r2 is not None, HAS_WEIGHT=weight is not None, BLOCK_D=block, num_warps=warps,
                )  # fmt: skip
        ctx.save_for_backward(s, weight, rstd)
        ctx.x_dtype, ctx.x_shape, ctx.has_residual = x.dtype, x.shape, r2 is not None
        if r2 is None:
            out_s = x.new_empty(0)
            ctx.mark_non_differentiable(out_s)
            return y, out_s
        return y, s

    @staticmethod
    def backward(ctx, dy, ds):
        s, weight, rstd = ctx.saved_tensors  # s: [T, D] or residual's shape, contiguous either way
        D = s.shape[-1]
        T = s.numel() // D if D else 0
        if dy is None:  # only the sum went on to the loss
            dy = torch.zeros(T, D, dtype=ctx.x_dtype, device=s.device)
        dy2 = dy.reshape(T, D).contiguous()
        ds2 = ds.reshape(T, D).contiguous() if ctx.has_residual and ds is not None else None
        dx = torch.empty(ctx.x_shape, dtype=ctx.x_dtype, device=s.device)  # returned as is (see forward)
        store_dr = ctx.has_residual and s.dtype != ctx.x_dtype
        dr = torch.empty(ctx.x_shape, dtype=s.dtype, device=s.device) if store_dr else None
        programs = _programs(s.device, T)
        new = torch.empty if T else torch.zeros  # every program writes its row of dw; with no rows none runs
        dw = new(programs, D, dtype=torch.float32, device=s.device) if weight is not None else None
        block, warps = _launch_options(D)
        if T:
            with on_device(s):
                _rms_norm_bwd_kernel[(programs,)](
                    dy2, dy2 if ds2 is None else ds2, s, s if weight is None else weight, rstd, dx,
                    dx if dr is None else dr, dx if dw is None else dw, T, D,
                    HAS_DS=ds2 is not None, HAS_WEIGHT=weight is not None, STORE_DR=store_dr, BLOCK_D=block,
                    num_warps=warps,
                )  # fmt: skip
        d_weight = None if weight is None else dw.sum(0).to(weight.dtype)
        d_residual = None if not ctx.has_residual else (dr if store_dr else dx)
        return dx, d_weight, d_residual, None


def triton_rms_norm(x, weight, *, eps, residual=None):
    """Args as `zebra_kernels.rms_norm` (checked there); returns (y, s), s = x without a residual."""
    y, s = TritonRMSNorm.apply(x, weight, residual, eps)
    return y, (x if residual is None else s)
