"""The decode-step Triton kernels (`zebra_kernels.mamba2.triton_step`, `zebra_kernels.conv.triton_step`,
`zebra_kernels.gemv.triton_fused`) run by Triton's interpreter on the CPU (numpy), against the float64 torch forms
on the same values: their indexing
(blocks over P and C, padded N and W, the group of each head), pads, strided views of the input projection,
bf16 inputs, and writing a static cache's buffer in place with its `feed` flag; then each kernel compiled by
Triton's real compiler for Hopper (no GPU needed). Their numerics on a GPU are tests/kernels/test_kernel_gpu.py's.
TRITON_INTERPRET must be set before a kernel is defined, so the interpreted kernels run in a process of their own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="needs triton (zebra-llama[fla] installs it)"
)

MAMBA2_STEP = """
import torch
from tests.kernels.test_kernel_mamba2 import step_inputs
from zebra_kernels.mamba2.step import torch_ssd_step
from zebra_kernels.mamba2.triton_step import triton_ssd_step
from zebra_kernels.testing import relative_error

x, dt, A, B, C, dt_bias, D, h0 = step_inputs(Bt=3, H=8, P=40, G=2, N=20)  # P spans 3 blocks, N a padded block
mask = torch.tensor([True, False, True])
proj = torch.cat([x.flatten(1), B.flatten(1), C.flatten(1), dt], dim=-1).float()  # the model's strided views
xv, bv, cv, dv = proj.split([8 * 40, 2 * 20, 2 * 20, 8], dim=-1)
cases = {
    "no state, no D": (x, dt, B, C, dict()),
    "state, D, mask": (x, dt, B, C, dict(D=D, state=h0, mask=mask)),
    "strided views": (xv.view(3, 8, 40), dv, bv.view(3, 2, 20), cv.view(3, 2, 20), dict(D=D, state=h0)),
    "bf16 x, B, C": (x.bfloat16(), dt, B.bfloat16(), C.bfloat16(), dict(D=D, state=h0)),
    "in place, feed": (x, dt, B, C, dict(D=D, state=h0, inplace=True, feed=torch.tensor(True))),
    "in place, no feed": (x, dt, B, C, dict(D=D, state=h0, inplace=True, feed=torch.tensor(False))),
}
for name, (xi, dti, Bi, Ci, kw) in cases.items():
    xi, Bi, Ci = (t if t.dtype == torch.bfloat16 else t.float() for t in (xi, Bi, Ci))
    f32 = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kw.items()}
    y, s = triton_ssd_step(xi, dti.float(), A.float(), Bi, Ci, dt_bias=dt_bias.float(), **f32)
    up = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kw.items()
          if k not in ("inplace", "feed")}
    y_ref, s_ref = torch_ssd_step(xi.double(), dti.double(), A.float().double(), Bi.double(), Ci.double(),
                                  dt_bias=dt_bias.float().double(), **up)
    if kw.get("feed") is not None and not kw["feed"]:
        s_ref = h0  # feed False: the buffer keeps the old state
    report(name, y, y_ref, s, s_ref, same_buffer=s is f32.get("state") if kw.get("inplace") else None,
           pad_row_kept=bool(torch.equal(s[1], h0[1].float())) if "mask" in kw else None)
"""

CONV_STEP = """
import torch
from zebra_kernels import causal_conv1d
from zebra_kernels.conv.triton_step import triton_conv_step_

gen = torch.Generator().manual_seed(0)
B, C, W = 3, 300, 4  # C spans 3 blocks of 128
x = torch.randn(B, C + 20, generator=gen)[:, 7 : 7 + C]  # a strided view, as the projection's
weight, bias = torch.randn(C, W, generator=gen), torch.randn(C, generator=gen)
state = torch.randn(B, C, W, generator=gen)
cases = {
    "silu, bias, fp32 state": (x, bias, state, "silu", None),
    "no activation, no bias": (x, None, state, None, None),
    "bf16 x and state": (x.bfloat16(), bias, state.bfloat16(), "silu", None),
    "feed true": (x, bias, state, "silu", torch.tensor(True)),
    "feed false": (x, bias, state, "silu", torch.tensor(False)),
    "width 3": (x, bias, state[..., :3].contiguous(), "silu", None),
}
for name, (xi, bi, si, act, feed) in cases.items():
    wi = weight[:, : si.shape[-1]].contiguous()
    y_ref, s_ref = causal_conv1d(xi.double()[:, None], wi.double(), None if bi is None else bi.double(),
                                 activation=act, initial_state=si.double(), output_final_state=True,
                                 backend="torch")
    buffer = si.clone()
    y = triton_conv_step_(xi, wi, bi, state=buffer, feed=feed, activation=act)
    if feed is not None and not feed:
        s_ref = si.double()
    report(name, y, y_ref[:, 0], buffer, s_ref, same_buffer=None, pad_row_kept=None)
"""

GEMV = """
import torch
from zebra_kernels.gemv.triton_fused import candidates, triton_gemv
gen = torch.Generator().manual_seed(0)


def reference(x, w, up, norm_w, res, eps=1e-6):
    # float64 on the same values, rounded where the unfused path stores: the normed rows, gate and up
    s = x.double() + (0 if res is None else res.double())
    h = s if norm_w is None else (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + eps) * norm_w.double())
    h = h.to(x.dtype).double()
    y = h @ w.double().T
    if up is not None:
        g, u = y.to(x.dtype).double(), (h @ up.double().T).to(x.dtype).double()
        y = g * torch.sigmoid(g) * u
    return y, s


for rows, n, k in [(1, 70, 300), (3, 33, 129), (8, 40, 96)]:  # ragged N and K blocks, 1 to 8 rows
    for dtype in (torch.float32, torch.bfloat16):
        w, up = (torch.randn(n, k, generator=gen).div(k**0.5).to(dtype) for _ in range(2))
        x, res = (torch.randn(rows, k, generator=gen).to(dtype) for _ in range(2))
        norm_w = (torch.rand(k, generator=gen) + 0.5).to(dtype)
        wide = torch.randn(rows, k + 16, generator=gen).to(dtype)[:, 5 : 5 + k]  # a strided view of a projection
        cases = {
            "plain": (x, dict()),
            "strided x": (wide, dict()),
            "swiglu": (x, dict(up_weight=up)),
            "norm": (x, dict(norm_weight=norm_w)),
            "norm, residual": (x, dict(norm_weight=norm_w, residual=res)),
            "norm, residual, swiglu": (x, dict(norm_weight=norm_w, residual=res, up_weight=up)),
        }
        for name, (xi, kw) in cases.items():
            for config in candidates(rows, n, k, 2, 1 + ("up_weight" in kw))[::2]:  # each block shape, 4 warps
                y, stream = triton_gemv(xi, w, config=config, **kw)
                y_ref, s_ref = reference(xi, w, kw.get("up_weight"), kw.get("norm_weight"), kw.get("residual"))
                report(f"{rows}x{n}x{k} {str(dtype)[6:]} {name} {config}", y, y_ref,
                       s_ref if stream is None else stream, s_ref, same_buffer=stream is None, pad_row_kept=None)

# the gated output norms before the output projection: Mamba2 (norm of x * silu(z) in groups, one weight over all
# channels, z a strided view of the input projection), GDN (per head: norm then * silu(g)), KDA (sigmoid)
from zebra_kernels.norm import torch_rms_norm_gated

for rows, n, segment, heads, group, before, act in [
    (1, 40, 256, 1, 64, False, "swish"),  # Mamba2: 4 groups of 64
    (3, 24, 32, 4, 32, True, "swish"),  # GDN: 4 heads of 32
    (2, 24, 32, 4, 32, True, "sigmoid"),  # KDA
]:
    k = segment * heads
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, k, generator=gen).to(dtype)
        z = torch.randn(rows, k + 8, generator=gen).to(dtype)[:, 3 : 3 + k]  # strided, as a projection's view
        norm_w = (torch.rand(segment, generator=gen) + 0.5).to(dtype)
        w = torch.randn(n, k, generator=gen).div(k**0.5).to(dtype)
        normed = torch_rms_norm_gated(
            x.double().view(rows, heads, segment), z.double().view(rows, heads, segment), norm_w.double(), 1e-6,
            act, before, group,
        ).view(rows, k)
        y_ref = normed.to(dtype).double() @ w.double().T  # rounded where the unfused norm stores
        name = ("mamba2" if not before else "gdn" if act == "swish" else "kda") + f" {str(dtype)[6:]}"
        for config in candidates(rows, n, k, 2)[::2]:
            y, _ = triton_gemv(x, w, norm_weight=norm_w, gate=z, eps=1e-6, group_size=group,
                               norm_before_gate=before, sigmoid=act == "sigmoid", config=config)
            report(f"{name} gated {config}", y, y_ref, x, x, same_buffer=True, pad_row_kept=None)
"""

REPORT = """
import json
import torch
from zebra_kernels.testing import relative_error
results = {}
def report(name, y, y_ref, s, s_ref, same_buffer, pad_row_kept):
    results[name] = dict(y_err=relative_error(y.double(), y_ref), s_err=relative_error(s.double(), s_ref.double()),
                         y_dtype=str(y.dtype), s_dtype=str(s.dtype), same_buffer=same_buffer,
                         pad_row_kept=pad_row_kept)
"""


def interpreted(script: str) -> dict[str, dict]:
    """Run `script` under TRITON_INTERPRET=1; the `report(...)` results of each case."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    code = REPORT + script + "\nprint(json.dumps(results))\n"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_mamba2_step_kernel():
    results = interpreted(MAMBA2_STEP)
    for name, r in results.items():
        bf16 = name.startswith("bf16")
        assert r["y_err"] < (2e-2 if bf16 else 1e-5) and r["s_err"] < 1e-5, (name, r)
        assert (r["y_dtype"], r["s_dtype"]) == (
            "torch.bfloat16" if bf16 else "torch.float32",
            "torch.float32",
        )
    assert results["state, D, mask"]["pad_row_kept"] is True  # the pad row's state is written back unchanged
    assert (
        results["in place, feed"]["same_buffer"] is True
        and results["in place, no feed"]["same_buffer"] is True
    )


def test_conv_step_kernel():
    results = interpreted(CONV_STEP)
    for name, r in results.items():
        bf16 = name.startswith("bf16")
        assert r["y_err"] < (1e-2 if bf16 else 1e-6), (name, r)
        assert r["s_err"] == 0.0, (name, r)  # the state holds raw inputs: rolled exactly, bf16 too
        assert r["s_dtype"] == ("torch.bfloat16" if bf16 else "torch.float32"), name


def test_gemv_kernel():
    """Every form (plain, strided input, SwiGLU epilogue, norm prologue with and without the residual add, the
    gated output norms of Mamba2, GDN and KDA with a strided gate) at
    ragged shapes and two block shapes each, against float64 rounded where the unfused path stores: exact to
    float32's sums in float32; in bf16 within its roundings (a flipped rounding of a normed input or of the gate
    moves a 70-wide output by up to 2%)."""
    results = interpreted(GEMV)
    assert len(results) == 3 * 2 * 6 * 2 + sum(1 for n in results if "gated" in n) and len(results) > 80
    assert {n.split(" (")[0] for n in results if "gated" in n} == {
        f"{m} {d} gated" for m in ("mamba2", "gdn", "kda") for d in ("float32", "bfloat16")
    }
    for name, r in results.items():
        bf16 = "bfloat16" in name
        assert r["y_err"] < (3e-2 if bf16 else 1e-6), (name, r)
        assert r["s_err"] < (1e-2 if bf16 else 1e-7), (name, r)  # the stream: x + residual in its dtype
        assert r["y_dtype"] == ("torch.bfloat16" if bf16 else "torch.float32"), name
        assert r["same_buffer"] is ("residual" not in name), name  # a stream comes back only with a residual


def gemv_signature(**constexprs):
    """The decode GEMV kernel's argument types (bf16 tensors, int32 sizes and strides, float32 eps) with its
    plain form's constexprs, `constexprs` changed."""
    plain = dict(NORM=False, HAS_RESIDUAL=False, SWIGLU=False, GATED=False, GROUP=1, NORM_BEFORE_GATE=True)
    plain |= dict(SIGMOID=False, BLOCK_R=1, BLOCK_N=8, BLOCK_K=512)
    return (
        "zebra_kernels.gemv.triton_fused:_gemv_kernel",
        ["*bf16"] * 8 + ["i32"] * 8 + ["fp32"],
        plain | constexprs,
    )


# (kernel, its argument types as the model calls it: bf16 activations, float32 states, bool flags; constexprs)
HOPPER_SIGNATURES = {
    "mamba2": (
        "zebra_kernels.mamba2.triton_step:_ssd_step_kernel",
        [
            "*bf16",
            "*bf16",
            "*fp32",
            "*fp32",
            "*bf16",
            "*bf16",
            "*fp32",
            "*i1",
            "*i1",
            "*fp32",
            "*fp32",
            "*bf16",
        ]
        + ["i32"] * 9,
        dict(
            HAS_D=True, HAS_MASK=True, HAS_STATE=True, HAS_FEED=True, BLOCK_N=64, BLOCK_P=16, THRESHOLD=20.0
        ),
    ),
    "conv": (
        "zebra_kernels.conv.triton_step:_conv_step_kernel",
        ["*bf16", "*bf16", "*bf16", "*bf16", "*i1", "*bf16", "i32", "i32", "i32"],
        dict(HAS_BIAS=True, HAS_FEED=True, SILU=True, BLOCK_C=128, BLOCK_W=4),
    ),
    "gemv": gemv_signature(NORM=True, HAS_RESIDUAL=True, SWIGLU=True),
    "gemv, 8 rows": gemv_signature(BLOCK_R=8, BLOCK_N=2),
    "gemv, gated": gemv_signature(GATED=True, GROUP=256, NORM_BEFORE_GATE=False),
}


def compile_for_hopper(path: str, types: list[str], constexprs: dict) -> None:
    """The kernel at `path` ("module:name") through Triton's real compiler to an sm_90 (H100/H200) binary, on a
    machine without a GPU: what the interpreter cannot catch (types, layouts, ptxas). Checked with Triton 3.7.1,
    the GPU machine's."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, attr = path.split(":")
    kernel = getattr(importlib.import_module(module), attr)
    assert len(kernel.arg_names) == len(types) + len(constexprs)
    signature = {
        n: "constexpr" if n in constexprs else t
        for n, t in zip(kernel.arg_names, types + [None] * len(constexprs), strict=True)
    }
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32)
    )
    assert len(compiled.asm["cubin"]) > 1000


@pytest.mark.parametrize("name", HOPPER_SIGNATURES)
def test_kernel_compiles_for_hopper(name):
    compile_for_hopper(*HOPPER_SIGNATURES[name])
