"""`zebra_kernels.rope.rope_qk`: MLA's two rotary embeddings in one Triton launch, against the torch form
(`torch_rotate_pairs`, itself checked against complex rotation here and against Megatron's in tests/models/test_mla.py)
in float64: under Triton's interpreter on the CPU (strided views, cos/sin shared by
the rows or per row, several tokens, head counts and widths that pad the blocks), compiled for Hopper, and on a GPU
at 1b-mamba-mla's shapes in bf16 and fp32 (marker `gpu`)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from zebra_kernels.rope import rope_qk, torch_rotate_pairs
from zebra_kernels.testing import relative_error

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def rope_inputs(B, T, H, D, shared, device="cpu", dtype=torch.float32, seed=0):
    """q, k as strided views (slices of wider projections), cos/sin `[1 or B, T, D / 2]`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, D + 6, generator=gen, device=device).to(dtype)[..., 3 : 3 + D]
    k = torch.randn(B, T, D + 4, generator=gen, device=device).to(dtype)[..., :D]
    angle = torch.randn(1 if shared else B, T, D // 2, generator=gen, device=device) * 3
    return q, k, angle.cos().to(dtype), angle.sin().to(dtype)


def reference(q, k, cos, sin):
    q, k, cos, sin = (x.double() for x in (q, k, cos, sin))
    return torch_rotate_pairs(q, cos[:, :, None], sin[:, :, None]), torch_rotate_pairs(k, cos, sin)


def test_torch_form_rotates_each_pair_as_a_complex_number():
    """Pair (2i, 2i+1) times e^(i angle_i), laid out `[real parts | imaginary parts]`: the CPU path of `rope_qk`."""
    q, k, cos, sin = rope_inputs(2, 3, 4, 8, shared=False, dtype=torch.float64)
    q_out, k_out = rope_qk(q, k, cos, sin)
    rotation = torch.complex(cos, sin)  # [B, T, D / 2], |rotation| = 1

    def rotated(x, r):
        z = torch.view_as_complex(x.contiguous().reshape(*x.shape[:-1], -1, 2)) * r  # [..., D / 2]
        return torch.cat((z.real, z.imag), dim=-1)

    torch.testing.assert_close(q_out, rotated(q, rotation[:, :, None]), atol=1e-12, rtol=0)
    torch.testing.assert_close(k_out, rotated(k, rotation), atol=1e-12, rtol=0)


INTERPRETED = """
import torch
from tests.kernels.test_rope import reference, rope_inputs
from zebra_kernels.rope.triton_fused import triton_rope_qk
from zebra_kernels.testing import relative_error

for B, T, H, D, shared in [(1, 1, 32, 32, True), (2, 3, 4, 16, False), (2, 5, 3, 12, True)]:
    q, k, cos, sin = rope_inputs(B, T, H, D, shared, seed=H)
    q_out, k_out = triton_rope_qk(q, k, cos, sin)
    q_ref, k_ref = reference(q, k, cos, sin)
    results[f"B{B} T{T} H{H} D{D} shared={shared}"] = dict(
        q_err=relative_error(q_out, q_ref), k_err=relative_error(k_out, k_ref),
        contiguous=q_out.is_contiguous() and k_out.is_contiguous(), shapes=[list(q_out.shape), list(k_out.shape)],
    )
"""


@needs_triton
def test_kernel_interpreted_matches_float64():
    from tests.kernels.test_triton_steps import interpreted

    results = interpreted(INTERPRETED)
    assert len(results) == 3
    for name, r in results.items():
        assert r["q_err"] < 1e-6 and r["k_err"] < 1e-6 and r["contiguous"], (name, r)


@needs_triton
def test_kernel_compiles_for_hopper():
    from tests.kernels.test_triton_steps import compile_for_hopper

    compile_for_hopper(
        "zebra_kernels.rope.triton_fused:_rope_kernel",
        ["*bf16"] * 6 + ["i32"] * 9,
        dict(HALF=16, BLOCK_H=64, BLOCK_D=16),
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("B", "T", "shared"), [(1, 1, True), (8, 1, True), (2, 64, False)])
def test_kernel_on_a_gpu_matches_float64(dtype, B, T, shared):
    q, k, cos, sin = rope_inputs(B, T, 32, 32, shared, device="cuda", dtype=dtype, seed=B + T)
    with torch.no_grad():
        q_out, k_out = rope_qk(q, k, cos, sin, backend="fla")
    q_ref, k_ref = reference(q, k, cos, sin)
    bound = 1e-2 if dtype == torch.bfloat16 else 1e-6
    assert relative_error(q_out, q_ref) < bound and relative_error(k_out, k_ref) < bound
    assert q_out.dtype == k_out.dtype == dtype
