"""The MLA decode Triton kernels (`zebra_kernels.mla_decode.triton_fused`) on a GPU against the float64 torch
reference, at 1b-mamba-mla's shapes (32 heads, latent 128, RoPE key 32): bf16 and fp32, lengths of 1, around the
64-token block and the 128-token split, per-row lengths, chunks of several new tokens, and one CUDA graph
replayed at changing lengths (the lengths a device tensor). Every relative error must be finite and under the
bound of its dtype; the output is poisoned before each run so an unwritten element fails.
"""

from __future__ import annotations

import math

import pytest
import torch
from tests.conftest import gpu_report

from zebra_kernels.mla_decode import mla_decode, torch_mla_decode
from zebra_kernels.mla_decode.triton_fused import triton_mla_decode
from zebra_kernels.testing import relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]

H, R, DR = 32, 128, 32
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-3}


def inputs(B, T, L, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(B, T, H, R), (B, T, H, DR), (B, L, R), (B, L, DR)]
    return [torch.randn(*s, generator=gen, device="cuda").to(dtype) for s in shapes]


def reference(q_latent, q_rope, latent, k_rope, lengths, scale):
    return torch_mla_decode(*(x.double() for x in (q_latent, q_rope, latent, k_rope)), lengths, scale)


def check(name, out, ref, dtype):
    err = relative_error(out, ref) if torch.isfinite(out).all() else math.inf
    gpu_report("mla_decode", {"case": name, "dtype": str(dtype), "rel_err": err})
    assert err < TOL[dtype], (name, err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    ("T", "L", "lengths"),
    [
        (1, 64, [1, 2]),
        (1, 300, [63, 65]),
        (1, 4096, [129, 4096]),
        (1, 33000, [32768, 1000]),
        (4, 1000, [4, 999]),
    ],
)
def test_mla_decode_kernel_matches_float64(dtype, T, L, lengths):
    q_latent, q_rope, latent, k_rope = inputs(len(lengths), T, L, dtype, seed=L + T)
    lengths = torch.tensor(lengths, device="cuda")
    out = triton_mla_decode(q_latent, q_rope, latent, k_rope, lengths, 0.125)
    check(
        f"T{T} L{L} {lengths.tolist()}",
        out,
        reference(q_latent, q_rope, latent, k_rope, lengths, 0.125),
        dtype,
    )
    assert out.dtype == dtype and out.shape == q_latent.shape
    # the dispatch takes the same kernels on a GPU
    assert torch.equal(mla_decode(q_latent, q_rope, latent, k_rope, lengths, 0.125, backend="fla"), out)


def test_mla_decode_graph_replays_at_changing_lengths():
    """One capture at length 1; replays at other lengths (written into the device tensor) and new inputs."""
    dtype, B, L = torch.bfloat16, 2, 5000
    bufs = inputs(B, 1, L, dtype, seed=0)
    lengths = torch.ones(B, dtype=torch.long, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        triton_mla_decode(*bufs, lengths, 0.1)  # compile and warm up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_mla_decode(*bufs, lengths, 0.1)
    for step, new_lengths in enumerate([[1, 1], [200, 7], [129, 4999], [5000, 64], [3, 2500]]):
        for buf, fresh in zip(bufs, inputs(B, 1, L, dtype, seed=step + 1), strict=True):
            buf.copy_(fresh)
        lengths.copy_(torch.tensor(new_lengths))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(f"graph replay {new_lengths}", out, reference(*bufs, lengths, 0.1), dtype)
