"""`zebra_kernels.norm.triton_fused` (RMSNorm with its residual add, the sublayer pre-norms on a GPU) run by
Triton's interpreter on the CPU, forward and backward through autograd, against float64 autograd on the same
values: residual or not, weight or not, the gradient of the returned sum used or not (or only it), bf16 x with a float32 or
bf16 residual stream, rows spread over fewer backward programs than rows, a padded channel block, no rows; then
both kernels through Triton's real compiler for Hopper. Their numerics on a GPU are tests/kernels/
test_kernel_gpu.py's (the `fla` backend's RMSNorm)."""

from __future__ import annotations

import pytest
from tests.kernels.test_triton_steps import compile_for_hopper, interpreted, pytestmark  # noqa: F401

RMS_NORM = """
import torch
from zebra_kernels.norm.triton_fused import triton_rms_norm

def reference(x, w, r, eps, gy, gs):
    x, r = x.double().requires_grad_(), None if r is None else r.double().requires_grad_()
    w = None if w is None else w.double().requires_grad_()
    s = x if r is None else x + r
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    y = y if w is None else y * w
    loss = (y * gy.double()).sum() + (0 if (r is None or gs is None) else (s * gs.double()).sum())
    loss.backward()
    return y, s, x.grad, None if r is None else r.grad, None if w is None else w.grad

gen = torch.Generator().manual_seed(0)
T, D = 40, 300  # 40 rows over 16 programs (2 "SMs" x 8); 300 channels pad a block of 512
x, r = torch.randn(2, T // 2, D, generator=gen), torch.randn(2, T // 2, D, generator=gen)
w = 1 + 0.1 * torch.randn(D, generator=gen)
gy, gs = torch.randn(2, T // 2, D, generator=gen), torch.randn(2, T // 2, D, generator=gen)
cases = {
    "residual, weight, ds": (x, w, r, gs),
    "residual, weight, no ds": (x, w, r, None),
    "no residual": (x, w, None, None),
    "no weight": (x, None, r, gs),
    "bf16 x, fp32 residual": (x.bfloat16(), w, r, gs),
    "bf16 x and residual": (x.bfloat16(), w, r.bfloat16(), gs),
}
for name, (xi, wi, ri, gsi) in cases.items():
    xg = xi.clone().requires_grad_()
    wg = None if wi is None else wi.clone().requires_grad_()
    rg = None if ri is None else ri.clone().requires_grad_()
    y, s = triton_rms_norm(xg, wg, eps=1e-6, residual=rg)
    loss = (y.double() * gy.double()).sum() + (0 if (rg is None or gsi is None) else (s.double() * gsi.double()).sum())
    loss.backward()
    ref = reference(xi, wi, ri, 1e-6, gy, gsi)
    got = (y, s, xg.grad, None if rg is None else rg.grad, None if wg is None else wg.grad)
    errs = {k: None if g is None else relative_error(g.double(), e)
            for k, g, e in zip(("y", "s", "dx", "dr", "dw"), got, ref)}
    results[name] = dict(errs=errs, dtypes=[None if g is None else str(g.dtype) for g in got],
                         s_is_x=s is xg)
xs, rs = x.clone().requires_grad_(), r.clone().requires_grad_()
_, s_only = triton_rms_norm(xs, w, eps=1e-6, residual=rs)
(s_only.double() * gs.double()).sum().backward()  # only the sum goes on: its gradient passes to x and residual
results["sum only"] = dict(errs={"dx": relative_error(xs.grad.double(), gs.double()),
                                 "dr": relative_error(rs.grad.double(), gs.double())}, dtypes=[])
empty = torch.empty(0, D, requires_grad=True)
y, _ = triton_rms_norm(empty, w.clone().requires_grad_(), eps=1e-6)
results["empty"] = dict(shape=list(y.shape))
"""


def test_rms_norm_kernels_forward_and_backward():
    results = interpreted(RMS_NORM)
    for name, r in results.items():
        if name in ("empty", "sum only"):
            continue
        bf16 = name.startswith("bf16")
        for quantity, err in r["errs"].items():
            bound = 1e-6 if not bf16 else (5e-3 if quantity != "s" or "and residual" in name else 1e-6)
            assert err is None or err < bound, (name, quantity, err)
        x_dtype, s_dtype = ("torch.bfloat16" if bf16 else "torch.float32"), r["dtypes"][1]
        assert r["dtypes"][0] == r["dtypes"][2] == x_dtype, name  # y and dx in x's dtype
        assert r["dtypes"][3] in (None, s_dtype), name  # d residual in the residual stream's dtype
    assert results["bf16 x, fp32 residual"]["dtypes"][1] == "torch.float32"
    assert results["no residual"]["s_is_x"] and results["no residual"]["errs"]["dr"] is None
    assert results["no weight"]["errs"]["dw"] is None and results["empty"]["shape"] == [0, 300]
    assert all(err < 1e-6 for err in results["sum only"]["errs"].values())


# the types the model calls them with: bf16 activations, a float32 residual stream and weight
RMS_SIGNATURES = {
    "forward": (
        "zebra_kernels.norm.triton_fused:_rms_norm_fwd_kernel",
        ["*bf16", "*fp32", "*fp32", "*bf16", "*fp32", "*fp32", "i32", "fp32"],
        dict(HAS_RESIDUAL=True, HAS_WEIGHT=True, BLOCK_D=2048),
    ),
    "backward": (
        "zebra_kernels.norm.triton_fused:_rms_norm_bwd_kernel",
        ["*bf16", "*fp32", "*fp32", "*fp32", "*fp32", "*bf16", "*fp32", "*fp32", "i32", "i32"],
        dict(HAS_DS=True, HAS_WEIGHT=True, STORE_DR=True, BLOCK_D=2048),
    ),
}


@pytest.mark.parametrize("name", RMS_SIGNATURES)
def test_rms_norm_kernel_compiles_for_hopper(name):
    compile_for_hopper(*RMS_SIGNATURES[name])
