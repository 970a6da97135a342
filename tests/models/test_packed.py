"""`packed.project`: one stacked GEMV for a decode step, the same numbers as the separate projections, and a
stacked weight that follows in-place updates and replaced weights."""

from __future__ import annotations

import torch
from torch import nn

from zebra.models.layers.packed import project


def projections():
    torch.manual_seed(0)
    module = nn.Module()
    module.a = nn.Linear(8, 3, bias=False).double()
    module.b = nn.Sequential(nn.Linear(8, 5, bias=False).double())
    return module


def test_a_decode_step_stacks_and_equals_separate_projections():
    module, x = projections(), torch.randn(2, 1, 8, dtype=torch.float64)
    with torch.no_grad():
        a, b = project(module, x, ("a", "b.0"))
    # a stacked GEMV and a separate Linear block the matmul differently: equal up to float64 rounding, not bitwise
    torch.testing.assert_close(a, module.a(x), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(b, module.b(x), rtol=1e-12, atol=1e-15)
    assert "_stacked_a_b_0" in module.__dict__ and "_stacked_a_b_0" not in dict(module.state_dict())


def test_training_and_prefill_do_not_stack():
    module = projections()
    outs = project(module, torch.randn(2, 1, 8, dtype=torch.float64), ("a", "b.0"))  # grad enabled
    assert all(o.requires_grad for o in outs)
    with torch.no_grad():
        project(module, torch.randn(2, 4, 8, dtype=torch.float64), ("a", "b.0"))  # 4 tokens: prefill
    assert not any(k.startswith("_stacked") for k in module.__dict__)


def test_the_stacked_weight_follows_in_place_updates_and_replacement():
    module, x = projections(), torch.randn(1, 1, 8, dtype=torch.float64)
    with torch.no_grad():
        project(module, x, ("a", "b.0"))
        module.a.weight.mul_(2.0)  # an optimizer step or load_state_dict writes in place
        a, _ = project(module, x, ("a", "b.0"))
        torch.testing.assert_close(a, module.a(x), rtol=1e-12, atol=1e-15)
        module.b[0].weight = nn.Parameter(torch.zeros(5, 8, dtype=torch.float64))
        _, b = project(module, x, ("a", "b.0"))
        assert torch.equal(b, torch.zeros(1, 1, 5, dtype=torch.float64))
