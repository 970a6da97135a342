"""`zebra_kernels.mla_decode`: the absorbed MLA decode attention that reads only the cached tokens.

CPU: the torch reference against a per-row float64 softmax written out by hand; the dispatch's host bound
(`max_length`) changes nothing; the Triton kernels under Triton's interpreter against float64 (fp32 and fp16: the
interpreter computes bf16 dots wrongly, so bf16 is the GPU tests'), then compiled for Hopper. The GPU numerics,
bf16 and graph replay are tests/kernels/test_kernel_gpu.py's.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from zebra_kernels.mla_decode import mla_decode, torch_mla_decode


def inputs(B, T, H, R, DR, L, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return randn(B, T, H, R), randn(B, T, H, DR), randn(B, L, R), randn(B, L, DR)


def by_hand(q_latent, q_rope, latent, k_rope, lengths, scale):
    """Each (row, token, head) on its own: scores over the visible slots, softmax, weighted latents."""
    B, T, H, R = q_latent.shape
    out = torch.empty(B, T, H, R, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            n = int(lengths[b]) - T + t + 1  # slots 0 .. n-1 are visible
            for h in range(H):
                s = (latent[b, :n] @ q_latent[b, t, h] + k_rope[b, :n] @ q_rope[b, t, h]) * scale
                out[b, t, h] = torch.softmax(s, dim=0) @ latent[b, :n]
    return out


@pytest.mark.parametrize(("T", "lengths"), [(1, [1, 5]), (1, [7, 9]), (3, [3, 8])])
def test_reference_attends_only_the_cached_tokens(T, lengths):
    q_latent, q_rope, latent, k_rope = inputs(2, T, 3, 8, 4, 9)
    lengths = torch.tensor(lengths)
    expected = by_hand(q_latent, q_rope, latent, k_rope, lengths, 0.3)
    out = torch_mla_decode(q_latent, q_rope, latent, k_rope, lengths, 0.3)
    assert torch.allclose(out, expected, atol=1e-12)
    # what lies past the length does not matter
    latent[0, lengths[0] :], k_rope[0, lengths[0] :] = 1e3, -1e3
    assert torch.allclose(
        torch_mla_decode(q_latent, q_rope, latent, k_rope, lengths, 0.3), expected, atol=1e-12
    )


def test_dispatch_slices_to_the_host_bound_and_takes_a_0d_length():
    q_latent, q_rope, latent, k_rope = inputs(2, 2, 3, 8, 4, 40)
    length = torch.tensor(11)
    full = mla_decode(q_latent, q_rope, latent, k_rope, length, 0.2, backend="torch")
    sliced = mla_decode(q_latent, q_rope, latent, k_rope, length, 0.2, max_length=11, backend="torch")
    assert torch.allclose(full, sliced, atol=1e-12)
    assert torch.allclose(full, by_hand(q_latent, q_rope, latent, k_rope, [11, 11], 0.2), atol=1e-12)
    assert torch.allclose(mla_decode(q_latent, q_rope, latent, k_rope, 11, 0.2), full, atol=1e-12)
    with pytest.raises(ValueError, match="latent must have shape"):
        mla_decode(q_latent, q_rope, latent[:1], k_rope, length, 0.2)


INTERPRETED = """
import torch
from tests.kernels.test_kernel_mla_decode import inputs
from zebra_kernels.mla_decode import torch_mla_decode
from zebra_kernels.mla_decode.triton_fused import triton_mla_decode
from zebra_kernels.testing import relative_error

cases = {  # name: (B, T, H, R, DR, L, lengths, dtype, splits)
    "length 1, 1b heads": (1, 1, 32, 128, 32, 300, [1], torch.float32, None),
    "two rows, 3 splits, one empty": (2, 1, 4, 32, 16, 300, [77, 300], torch.float32, 3),
    "chunk of 3 tokens, odd length": (1, 3, 4, 32, 16, 200, [130], torch.float32, None),
    "0-d length, full cache": (1, 1, 4, 24, 12, 257, 257, torch.float32, 5),
    "fp16": (2, 1, 16, 32, 16, 130, [65, 129], torch.float16, 2),
}
for name, (B, T, H, R, DR, L, lengths, dtype, splits) in cases.items():
    q_latent, q_rope, latent, k_rope = inputs(B, T, H, R, DR, L, seed=len(name))
    lengths = torch.tensor(lengths)
    rounded = [x.to(dtype) for x in (q_latent, q_rope, latent, k_rope)]
    ref = torch_mla_decode(*(x.double() for x in rounded), lengths, 0.1)
    if name == "fp16":  # the queries as strided views (the absorbing einsum's output, a slice of q)
        rounded[0] = torch.cat([rounded[0], rounded[0]], dim=-1).transpose(1, 2).contiguous().transpose(1, 2)[..., :R]
        rounded[1] = torch.cat([rounded[1], rounded[1]], dim=-1)[..., DR:]
        assert not rounded[0].is_contiguous() and not rounded[1].is_contiguous()
    out = triton_mla_decode(*rounded, lengths, 0.1, splits=splits)
    results[name] = dict(err=relative_error(out, ref), finite=bool(torch.isfinite(out).all()), dtype=str(out.dtype))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_triton_kernels_interpreted_match_float64():
    from tests.kernels.test_triton_steps import interpreted

    results = interpreted(INTERPRETED)
    assert len(results) == 5
    for name, r in results.items():
        fp16 = name == "fp16"
        assert r["finite"] and r["err"] < (2e-3 if fp16 else 1e-5), (name, r)
        assert r["dtype"] == ("torch.float16" if fp16 else "torch.float32"), name


SPLIT_TYPES = ["*bf16"] * 4 + ["*i64", "*fp32", "*fp32"] + ["i32"] * 6 + ["fp32"] + ["i32"] * 11


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.parametrize(
    ("kernel", "types", "constexprs"),
    [
        (
            "_split_kernel",
            SPLIT_TYPES,
            dict(IEEE=False, BLOCK_H=32, BLOCK_N=64, BLOCK_R=128, BLOCK_DR=32, MIN_CHUNK=128),
        ),
        (
            "_combine_kernel",
            ["*fp32", "*fp32", "*i64", "*bf16"] + ["i32"] * 4,
            dict(BLOCK_S=16, BLOCK_R=128, BLOCK_N=64, MIN_CHUNK=128),
        ),
    ],
)
def test_kernels_compile_for_hopper(kernel, types, constexprs):
    from tests.kernels.test_triton_steps import compile_for_hopper

    compile_for_hopper(f"zebra_kernels.mla_decode.triton_fused:{kernel}", types, constexprs)
