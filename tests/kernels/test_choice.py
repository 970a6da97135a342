"""`zebra_kernels.choice.record_choice_`: the decode loop's bookkeeping after a token choice, fused into one
Triton launch, against the unfused torch form on random states (rows emitting or still feeding, stopped or not,
budgets of 0-2 tokens, stop ids hit or missed, padded stop slots): under Triton's interpreter on the CPU, compiled
for Hopper, and on a GPU (marker `gpu`). Every buffer must come out equal, exactly."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from zebra_kernels.choice import record_choice_, torch_record_choice_

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def random_state(
    B: int, S: int, seed: int, device: str = "cpu"
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(nxt, buffers): tokens in 0..9, stop ids among them (a few slots padded with -1)."""
    gen = torch.Generator().manual_seed(seed)
    stop_ids = torch.randint(0, 10, (S,), generator=gen)
    stop_ids[S // 2 :] = -1
    buffers = dict(
        tokens=torch.full((B, 1), -7),
        emitting=torch.rand(B, generator=gen) < 0.8,
        remaining=torch.randint(0, 3, (B,), generator=gen),
        stopped=torch.rand(B, generator=gen) < 0.3,
        running=torch.tensor(True),
        stop_ids=stop_ids,
    )
    nxt = torch.randint(0, 10, (B,), generator=gen)
    return nxt.to(device), {k: v.to(device) for k, v in buffers.items()}


def cloned(buffers):
    return {k: v.clone() for k, v in buffers.items()}


def test_torch_form_counts_stops_and_feeds():
    nxt = torch.tensor([4, 5, 4, 6])
    buffers = dict(
        tokens=torch.zeros(4, 1, dtype=torch.long),
        emitting=torch.tensor([True, True, False, True]),
        remaining=torch.tensor([3, 1, 5, 2]),
        stopped=torch.tensor([False, False, False, True]),
        running=torch.tensor(True),
        stop_ids=torch.tensor([4, -1]),
    )
    torch_record_choice_(nxt, **buffers)
    assert buffers["tokens"][:, 0].tolist() == [4, 5, 4, 6]
    assert buffers["remaining"].tolist() == [2, 0, 5, 2]  # a row still feeding or stopped counts nothing
    assert buffers["stopped"].tolist() == [
        True,
        True,
        False,
        True,
    ]  # stop id; last token; feeding; was stopped
    assert bool(buffers["running"])  # row 2 runs on
    torch_record_choice_(
        torch.tensor([1, 1, 4, 1]), **{**buffers, "emitting": torch.ones(4, dtype=torch.bool)}
    )
    assert not bool(buffers["running"])


INTERPRETED = """
import torch
from tests.kernels.test_choice import cloned, random_state
from zebra_kernels.choice import torch_record_choice_
from zebra_kernels.choice.triton_fused import triton_record_choice_

for B, S, seed in [(1, 8, 0), (3, 8, 1), (8, 16, 2), (5, 8, 3), (8, 8, 4), (1, 8, 5)]:
    nxt, buffers = random_state(B, S, seed)
    want, got = cloned(buffers), cloned(buffers)
    torch_record_choice_(nxt, **want)
    triton_record_choice_(nxt, **got)
    results[f"B{B} S{S} seed{seed}"] = dict(
        equal=all(torch.equal(want[k], got[k]) for k in want), running=bool(want["running"]),
        stops=int(want["stopped"].sum() - buffers["stopped"].sum()),
    )
"""


@needs_triton
def test_fused_kernel_interpreted_equals_torch_form():
    from tests.kernels.test_triton_steps import interpreted

    results = interpreted(INTERPRETED)
    assert all(r["equal"] for r in results.values()), results
    assert any(r["stops"] > 0 for r in results.values())  # the cases stop rows ...
    assert {r["running"] for r in results.values()} == {True, False}  # ... and end a decode


@needs_triton
def test_fused_kernel_compiles_for_hopper():
    from tests.kernels.test_triton_steps import compile_for_hopper

    compile_for_hopper(
        "zebra_kernels.choice.triton_fused:_record_choice_kernel",
        ["*i64", "*i64", "*i1", "*i64", "*i1", "*i1", "*i64", "i32", "i32", "i32"],
        dict(BLOCK_B=8, BLOCK_S=8),
    )


def test_dispatch_runs_the_torch_form_on_a_cpu():
    nxt, buffers = random_state(6, 8, seed=9)
    want, got = cloned(buffers), cloned(buffers)
    torch_record_choice_(nxt, **want)
    record_choice_(nxt, **got)
    assert all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("B", [1, 8, 64])
def test_fused_kernel_on_a_gpu_equals_torch_form(B):
    for seed in range(20):
        nxt, buffers = random_state(B, 8, seed, device="cuda")
        want, got = cloned(buffers), cloned(buffers)
        torch_record_choice_(nxt, **want)
        record_choice_(nxt, **got, fused=True)
        assert all(torch.equal(want[k], got[k]) for k in want), (B, seed)
