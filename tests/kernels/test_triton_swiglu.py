"""`zebra_kernels.swiglu.triton_fused` (the MLP's SwiGLU and down projection on a GPU) run by Triton's interpreter on
the CPU, forward and backward through autograd, against float64 autograd of `linear(silu(gate) * up)` on the same
values: gate and up as strided views of one projection or contiguous, with and without bias, only the weight's
or only the inputs' gradients, bf16 activations; a padded column block; then both kernels through Triton's real
compiler for Hopper. Their numerics on a GPU are tests/kernels/test_kernel_gpu.py's (`swiglu_linear` on the
`fla` backend)."""

from __future__ import annotations

import pytest
from tests.kernels.test_triton_steps import compile_for_hopper, interpreted, pytestmark  # noqa: F401

SWIGLU = """
import torch
import torch.nn.functional as F
from zebra_kernels.swiglu.triton_fused import triton_swiglu_linear

gen = torch.Generator().manual_seed(0)
T, Fd, D = 6, 1300, 12  # 1300 columns: one full block of 1024 and a padded one
proj = torch.randn(2, T // 2, 2 * Fd, generator=gen)  # a fused up projection: gate and up as strided views
gate, up = proj[..., :Fd], proj[..., Fd:]
weight, bias = torch.randn(D, Fd, generator=gen) / Fd**0.5, torch.randn(D, generator=gen)
dout = torch.randn(2, T // 2, D, generator=gen)
cases = {
    "strided views, bias": (gate, up, bias, (True, True, True, True)),
    "contiguous, no bias": (gate.contiguous(), up.contiguous(), None, (True, True, True, False)),
    "weight grad only": (gate, up, bias, (False, False, True, True)),
    "input grads only": (gate, up, None, (True, True, False, False)),
    "bf16 gate and up": (gate.bfloat16(), up.bfloat16(), bias, (True, True, True, True)),
}
for name, (g, u, b, needs) in cases.items():
    args = [g.clone(), u.clone(), weight.clone(), None if b is None else b.clone()]
    for a, need in zip(args, needs):
        if a is not None:
            a.requires_grad_(need)
    # bf16 inputs meet the float32 weight and bias cast to bf16, as autocast casts them on a GPU
    out = triton_swiglu_linear(args[0], args[1], args[2].to(g.dtype), None if b is None else args[3].to(g.dtype))
    (out.double() * dout.double()).sum().backward()
    ref_args = [a.detach().double().requires_grad_(a.requires_grad) if a is not None else None for a in args]
    ref = F.linear(F.silu(ref_args[0]) * ref_args[1], ref_args[2], ref_args[3])
    (ref * dout.double()).sum().backward()
    errs = {"out": relative_error(out.double(), ref.detach())}
    for key, a, r in zip(("dgate", "dup", "dweight", "dbias"), args, ref_args):
        errs[key] = None if a is None or not a.requires_grad else relative_error(a.grad.double(), r.grad)
    results[name] = dict(errs=errs, out_dtype=str(out.dtype),
                         grad_dtypes=[None if a is None or a.grad is None else str(a.grad.dtype) for a in args])
"""


def test_swiglu_linear_kernels_forward_and_backward():
    results = interpreted(SWIGLU)
    for name, r in results.items():
        bound = 1e-2 if name.startswith("bf16") else 1e-6
        assert all(err is None or err < bound for err in r["errs"].values()), (name, r["errs"])
    assert results["weight grad only"]["errs"]["dgate"] is None  # the inputs' gradient is not computed
    assert results["input grads only"]["errs"]["dweight"] is None
    bf16 = results["bf16 gate and up"]
    assert bf16["out_dtype"] == "torch.bfloat16" and bf16["grad_dtypes"][:2] == ["torch.bfloat16"] * 2


SWIGLU_SIGNATURES = {  # bf16 activations, as under autocast
    "forward": (
        "zebra_kernels.swiglu.triton_fused:_swiglu_fwd_kernel",
        ["*bf16", "*bf16", "*bf16", "i32", "i32", "i32"],
        dict(BLOCK_F=1024),
    ),
    "backward": (
        "zebra_kernels.swiglu.triton_fused:_swiglu_bwd_kernel",
        ["*bf16"] * 6 + ["i32", "i32", "i32"],
        dict(STORE_Z=True, BLOCK_F=1024),
    ),
}


@pytest.mark.parametrize("name", SWIGLU_SIGNATURES)
def test_swiglu_kernel_compiles_for_hopper(name):
    compile_for_hopper(*SWIGLU_SIGNATURES[name])
