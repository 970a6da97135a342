"""`packed.project`: one stacked GEMV for a decode step, the same numbers as the separate projections, and a
stacked weight that follows in-place updates and replaced weights."""

from __future__ import annotations

import torch
from torch import nn

from zebra.models.layers.packed import derived, project


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


def test_joined_projections_are_one_tensor_while_decoding_and_in_training():
    module, x = projections(), torch.randn(2, 1, 8, dtype=torch.float64)
    with torch.no_grad():
        joined, b = project(module, x, ("a", "b.0"), joined=1)
        both = project(module, x, ("a", "b.0"), joined=2)[0]
    torch.testing.assert_close(joined, module.a(x), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(b, module.b(x), rtol=1e-12, atol=1e-15)
    assert both.shape == (2, 1, 8) and both._base is not None  # a view of the stacked GEMV's output, no copy
    torch.testing.assert_close(both, torch.cat([module.a(x), module.b(x)], -1), rtol=1e-12, atol=1e-15)
    trained = project(module, x, ("a", "b.0"), joined=2)[0]  # grad enabled: separate Linears, concatenated
    assert trained.requires_grad and torch.equal(
        trained.detach(), torch.cat([module.a(x), module.b(x)], -1).detach()
    )


def test_a_derived_tensor_is_made_once_per_weight_version():
    module = projections()
    calls = []

    def make(sources):
        calls.append(1)
        return sources[0] * 2

    with torch.no_grad():
        first = derived(module, "twice", [module.a.weight], make)
        assert derived(module, "twice", [module.a.weight], make) is first and len(calls) == 1
        module.a.weight.add_(1.0)
        torch.testing.assert_close(derived(module, "twice", [module.a.weight], make), module.a.weight * 2)
        assert len(calls) == 2
    assert derived(module, "twice", [module.a.weight], make).requires_grad  # training: recomputed, with grad
    assert len(calls) == 3
