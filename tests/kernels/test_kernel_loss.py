"""linear_cross_entropy (torch backend) against `F.cross_entropy(hidden @ weight.T, labels)`: values and
gradients in float64, chunks that do not divide N, ignored rows, frozen inputs, a tied embedding, and bf16
autocast against the unfused autocast path. CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zebra_kernels import linear_cross_entropy
from zebra_kernels.testing import relative_error

N, D, V = 37, 16, 50


def inputs(dtype=torch.float64, seed=0, ignored_every=5):
    """hidden [N, D], weight [V, D] (leaves with grad), labels [N] with every `ignored_every`-th row -100."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    weight = (torch.randn(V, D, generator=gen, dtype=torch.float64) * 0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=gen)
    if ignored_every:
        labels[::ignored_every] = -100
    return hidden, weight, labels


def loss_and_grads(loss_fn, hidden, weight, grad_out=0.37):
    """The loss and its gradients w.r.t. (hidden, weight) for an upstream gradient `grad_out` (not 1, so the
    backward's scaling is checked too)."""
    loss = loss_fn(hidden, weight)
    return (loss, *torch.autograd.grad(loss * grad_out, (hidden, weight)))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("chunk_size", [8, N, 64], ids=["chunk8-of-37", "one-chunk", "chunk-above-N"])
def test_equals_cross_entropy_of_the_logits_float64(reduction, chunk_size):
    hidden, weight, labels = inputs()
    got = loss_and_grads(
        lambda h, w: linear_cross_entropy(
            h, w, labels, reduction=reduction, chunk_size=chunk_size, backend="torch"
        ),
        hidden,
        weight,
    )
    want = loss_and_grads(lambda h, w: F.cross_entropy(h @ w.T, labels, reduction=reduction), hidden, weight)
    assert got[0].dtype == torch.float64
    for name, g, w in zip(("loss", "d_hidden", "d_weight"), got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-12, msg=name)
    assert got[1][::5].abs().max() == 0  # ignored rows get no gradient


def test_custom_ignore_index():
    hidden, weight, labels = inputs(ignored_every=0)
    labels[3] = 7
    loss = linear_cross_entropy(hidden, weight, labels, ignore_index=7, reduction="mean", backend="torch")
    torch.testing.assert_close(loss, F.cross_entropy(hidden @ weight.T, labels, ignore_index=7))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_all_ignored_is_zero_with_zero_gradients(reduction):
    hidden, weight, labels = inputs()
    labels[:] = -100
    loss, d_hidden, d_weight = loss_and_grads(
        lambda h, w: linear_cross_entropy(h, w, labels, reduction=reduction, chunk_size=8, backend="torch"),
        hidden,
        weight,
    )
    assert loss.item() == 0.0 and d_hidden.abs().max() == 0 and d_weight.abs().max() == 0


@pytest.mark.parametrize("frozen", ["weight", "hidden"])
def test_an_input_without_grad_gets_none_and_the_other_is_exact(frozen):
    hidden, weight, labels = inputs()
    (hidden if frozen == "hidden" else weight).requires_grad_(False)
    live = weight if frozen == "hidden" else hidden
    loss = linear_cross_entropy(hidden, weight, labels, chunk_size=8, backend="torch")
    (got,) = torch.autograd.grad(loss, live)
    (want,) = torch.autograd.grad(F.cross_entropy(hidden @ weight.T, labels, reduction="sum"), live)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_no_grad_gives_the_loss_only():
    hidden, weight, labels = inputs()
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, labels, chunk_size=8, backend="torch")
    assert not loss.requires_grad
    torch.testing.assert_close(loss, F.cross_entropy(hidden @ weight.T, labels, reduction="sum").detach())


def test_gradient_reaches_a_tied_embedding():
    gen = torch.Generator().manual_seed(1)
    emb = torch.nn.Embedding(V, D).double()
    torch.nn.init.normal_(emb.weight, generator=gen)
    ids = torch.randint(0, V, (N,), generator=gen)
    labels = ids.roll(-1)
    labels[-1] = -100
    grads = []
    for fused in (True, False):
        emb.zero_grad()
        hidden = torch.tanh(emb(ids))  # [N, D], the head reads the same matrix as the embedding
        if fused:
            loss = linear_cross_entropy(
                hidden, emb.weight, labels, reduction="mean", chunk_size=8, backend="torch"
            )
        else:
            loss = F.cross_entropy(hidden @ emb.weight.T, labels)
        loss.backward()
        grads.append(emb.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_bf16_autocast_matches_the_unfused_autocast_path(reduction):
    """fp32 master weight and fp32 hidden under CPU bf16 autocast: bf16 matmuls, float32 softmax, as
    `F.cross_entropy(F.linear(h, w).float(), labels)` computes under autocast."""
    hidden, weight, labels = inputs(torch.float32)
    reference = loss_and_grads(
        lambda h, w: F.cross_entropy(h.double() @ w.double().T, labels, reduction=reduction), hidden, weight
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = loss_and_grads(
            lambda h, w: linear_cross_entropy(
                h, w, labels, reduction=reduction, chunk_size=8, backend="torch"
            ),
            hidden,
            weight,
        )
        unfused = loss_and_grads(
            lambda h, w: F.cross_entropy(F.linear(h, w).float(), labels, reduction=reduction), hidden, weight
        )
    assert fused[0].dtype == torch.float32
    assert fused[1].dtype == torch.float32 and fused[2].dtype == torch.float32  # grads in the leaves' dtype
    for name, f, u, r in zip(("loss", "d_hidden", "d_weight"), fused, unfused, reference, strict=True):
        assert relative_error(f, u) < 1e-2, name
        # bf16 rounding dominates both: the fused path is no further from float64 than the unfused one
        assert relative_error(f, r) < 1.5 * relative_error(u, r) + 1e-6, name
        assert relative_error(f, r) > 2e-6, name  # the matmuls really ran in bf16 (fp32 ones: ~1e-7)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"hidden": (N,)}, "hidden must be"),
        ({"weight": (V, D + 1)}, "weight must have shape"),
        ({"labels": (N + 1,)}, "labels must have shape"),
    ],
)
def test_bad_shapes_are_refused(shape, message):
    hidden = torch.zeros(shape.get("hidden", (N, D)), dtype=torch.float64)
    weight = torch.zeros(shape.get("weight", (V, D)), dtype=torch.float64)
    labels = torch.zeros(shape.get("labels", (N,)), dtype=torch.long)
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(hidden, weight, labels, backend="torch")


def test_bad_reduction_and_chunk_are_refused():
    hidden, weight, labels = inputs()
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(hidden, weight, labels, reduction="none", backend="torch")
    with pytest.raises(ValueError, match="chunk_size"):
        linear_cross_entropy(hidden, weight, labels, chunk_size=0, backend="torch")
