"""`swiglu_linear` with our two Triton kernels for `silu(gate) * up` (GPU; also under `TRITON_INTERPRET=1` on a
CPU, as the tests run them): the MLP of every `-` sublayer in training.

Why not FLA's: its SwiGLU kernels index a flat range of elements, deriving each one's row and column with 64-bit
arithmetic, and take well over what their bytes need (docs/kernels.md, "The pre-norm and the MLP", has the
figures). Here each program takes one row and a block of contiguous columns. The function is FLA's otherwise:
`silu(gate) * up` is not kept for backward but recomputed by the backward kernel, next to the gate and up
gradients; the matmuls run under the caller's autocast, in backward too.

Forward: `z = silu(g) * u` (float32 math, stored in g's dtype), `out = z @ W^T + b`. Backward, with `dz = dout @ W`
and `s = sigmoid(g)`: `dg = dz * u * s * (1 + g * (1 - s))`, `du = dz * g * s`, `dW = dout^T @ z`, `db = sum dout`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from zebra_kernels._common import on_device

BLOCK_F = 1024  # columns per program: 8 per row of 1b-gdn-pure's 8,192


@triton.jit
def _swiglu_fwd_kernel(
    gate_ptr,  # [T, F], row stride stride_g, columns contiguous
    up_ptr,  # [T, F], row stride stride_u
    z_ptr,  # [T, F] contiguous
    F,
    stride_g,
    stride_u,
    BLOCK_F: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)  # [BLOCK_F]
    mask = cols < F
    g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    z = g * tl.sigmoid(g) * u
    tl.store(z_ptr + row * F + cols, z.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    gate_ptr,  # [T, F], row stride stride_g
    up_ptr,  # [T, F], row stride stride_u
    dz_ptr,  # [T, F] contiguous
    dgate_ptr,  # [T, F] contiguous
    dup_ptr,  # [T, F] contiguous
    z_ptr,  # [T, F] contiguous: silu(g) * u again, for the weight gradient (unused without STORE_Z)
    F,
    stride_g,
    stride_u,
    STORE_Z: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = cols < F
    g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    dz = tl.load(dz_ptr + row * F + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    silu = g * s
    tl.store(
        dgate_ptr + row * F + cols,
        (dz * u * s * (1.0 + g * (1.0 - s))).to(dgate_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(dup_ptr + row * F + cols, (dz * silu).to(dup_ptr.dtype.element_ty), mask=mask)
    if STORE_Z:
        tl.store(z_ptr + row * F + cols, (silu * u).to(z_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` as [T, F] rows whose columns are contiguous (a view where it can be)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _swiglu(gate2: torch.Tensor, up2: torch.Tensor) -> torch.Tensor:
    T, F_ = gate2.shape
    z = torch.empty(T, F_, dtype=gate2.dtype, device=gate2.device)
    if T:
        with on_device(gate2):
            _swiglu_fwd_kernel[(T, triton.cdiv(F_, BLOCK_F))](
                gate2, up2, z, F_, gate2.stride(0), up2.stride(0), BLOCK_F=BLOCK_F
            )
    return z


class TritonSwiGLULinear(torch.autograd.Function):
    """out = linear(silu(gate) * up, weight, bias), keeping gate and up (not the product) for backward."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, gate, up, weight, bias):
        gate2, up2 = _rows(gate), _rows(up)
        z = _swiglu(gate2, up2)  # [T, F]
        ctx.save_for_backward(gate2, up2, weight)
        ctx.gate_shape, ctx.gate_dtype, ctx.up_dtype = gate.shape, gate.dtype, up.dtype
        return F.linear(z, weight, bias).view(*gate.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, dout):
        gate2, up2, weight = ctx.saved_tensors
        T, F_ = gate2.shape
        dout2 = dout.reshape(T, -1)  # [T, D]
        need_gate_up = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        need_weight = ctx.needs_input_grad[2]
        d_gate = d_up = d_weight = None
        z = None
        if need_gate_up:
            dz = F.linear(dout2, weight.t()).to(gate2.dtype).contiguous()  # [T, F]
            d_gate = torch.empty(T, F_, dtype=ctx.gate_dtype, device=gate2.device)
            d_up = torch.empty(T, F_, dtype=ctx.up_dtype, device=gate2.device)
            z = torch.empty(T, F_, dtype=gate2.dtype, device=gate2.device) if need_weight else None
            if T:
                with on_device(gate2):
                    _swiglu_bwd_kernel[(T, triton.cdiv(F_, BLOCK_F))](
                        gate2, up2, dz, d_gate, d_up, d_gate if z is None else z, F_, gate2.stride(0), up2.stride(0),
                        STORE_Z=z is not None, BLOCK_F=BLOCK_F,
                    )  # fmt: skip
            d_gate, d_up = d_gate.view(ctx.gate_shape), d_up.view(ctx.gate_shape)
        elif need_weight:
            z = _swiglu(gate2, up2)
        if need_weight:
            d_weight = (dout2.t() @ z.to(dout2.dtype)).to(weight.dtype)  # [D, F]
        d_bias = dout2.sum(0) if ctx.needs_input_grad[3] else None
        return d_gate, d_up, d_weight, d_bias


def triton_swiglu_linear(gate, up, weight, bias=None):
    """Args as `zebra_kernels.swiglu_linear` (checked there)."""
    return TritonSwiGLULinear.apply(gate, up, weight, bias)
