"""The chunked distillation loss against a plain full-logit float64 reference."""

import pytest
import torch
import torch.nn.functional as F

from zebra.train.distill import DistillWeights
from zebra.train.distill_loss import linear_distill_loss


def reference(hidden, weight, teacher_logits, labels, w: DistillWeights):
    """KL(p_t || q_s) at temperature tau (x tau^2) + ce_weight x CE, summed over counted tokens; float64."""
    zs = hidden @ weight.T
    keep = labels != -100
    tau = w.temperature
    log_q = F.log_softmax(zs / tau, -1)
    log_p = F.log_softmax(teacher_logits.double() / tau, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)[keep].sum()
    ce = F.cross_entropy(zs, labels, ignore_index=-100, reduction="sum")
    teacher_ce = F.cross_entropy(teacher_logits.double(), labels, ignore_index=-100, reduction="sum")
    return w.kl_weight * tau**2 * kl + w.ce_weight * ce, torch.stack([kl, ce, teacher_ce])


def inputs(n=13, d=6, v=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, d, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(n, v, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, v, (n,), generator=g)
    labels[[2, 7]] = -100
    return hidden, weight, teacher, labels


@pytest.mark.parametrize(
    "w", [DistillWeights(), DistillWeights(0.5, 0.3, 2.0), DistillWeights(0.0, 1.0, 1.0)], ids=str
)
def test_matches_full_logit_reference_value_and_gradient(w):
    hidden, weight, teacher, labels = inputs()
    loss, sums = linear_distill_loss(hidden, weight, teacher, labels, w, chunk_size=4)
    ref_loss, ref_sums = reference(hidden, weight, teacher, labels, w)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sums, ref_sums.detach(), rtol=1e-10, atol=1e-10)
    got = torch.autograd.grad(loss, (hidden, weight))
    want = torch.autograd.grad(ref_loss, (hidden, weight))
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


def test_kl_is_zero_when_the_student_is_the_teacher():
    hidden, weight, _, labels = inputs()
    _, sums = linear_distill_loss(hidden, weight, (hidden @ weight.T).detach(), labels, chunk_size=5)
    assert abs(sums[0].item()) < 1e-12
    torch.testing.assert_close(sums[1], sums[2])


def test_bf16_matmuls_stay_close_to_float32():
    hidden, weight, teacher, labels = (t.detach().float() if t.is_floating_point() else t for t in inputs())
    hidden.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_distill_loss(hidden, weight, teacher.bfloat16(), labels, chunk_size=4)
    ref, _ = reference(
        hidden.double(), weight.double(), teacher.bfloat16().double(), labels, DistillWeights()
    )
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=3e-2, atol=3e-2)
    loss.backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()


def test_mismatched_vocabularies_are_refused():
    hidden, weight, teacher, labels = inputs()
    with pytest.raises(ValueError, match="do not match"):
        linear_distill_loss(hidden, weight, teacher[:, :-1], labels)


def top_k_reference(hidden, weight, teacher_logits, labels, k, ce_weight=0.0):
    """KL between the teacher's top-k + rest partition and the student's on the same partition, by autograd."""
    zs = hidden @ weight.T
    keep = labels != -100
    log_q, log_p = F.log_softmax(zs, -1), F.log_softmax(teacher_logits.double(), -1)
    top = teacher_logits.topk(k, -1).indices
    p_k, log_q_k = log_p.gather(1, top).exp(), log_q.gather(1, top)
    p_rest, q_rest = 1 - p_k.sum(-1), 1 - log_q_k.exp().sum(-1)
    kl = (p_k * (log_p.gather(1, top) - log_q_k)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())
    ce = F.cross_entropy(zs, labels, ignore_index=-100, reduction="sum")
    return kl[keep].sum() + ce_weight * ce


@pytest.mark.parametrize("ce_weight", [0.0, 0.4])
def test_top_k_matches_its_reference_and_at_k_v_equals_the_full_kl(ce_weight):
    hidden, weight, teacher, labels = inputs()
    loss, _ = linear_distill_loss(hidden, weight, teacher, labels, DistillWeights(ce_weight=ce_weight, top_k=3),
                                  chunk_size=4)  # fmt: skip
    ref = top_k_reference(hidden, weight, teacher, labels, 3, ce_weight)
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-9)
    got = torch.autograd.grad(loss, (hidden, weight))
    for g, r in zip(got, torch.autograd.grad(ref, (hidden, weight)), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-7, atol=1e-9)
    full, _ = linear_distill_loss(hidden, weight, teacher, labels, DistillWeights(ce_weight=ce_weight))
    at_v, _ = linear_distill_loss(
        hidden, weight, teacher, labels, DistillWeights(ce_weight=ce_weight, top_k=11)
    )
    torch.testing.assert_close(at_v, full, rtol=1e-10, atol=1e-10)


def test_a_top_k_of_the_logits_gives_the_loss_of_the_logits():
    """What a logit cache stores (`top_k_of`) gives the same loss and sums as the teacher's logits themselves."""
    from zebra.train.distill_loss import top_k_of

    hidden, weight, teacher, labels = inputs()
    w = DistillWeights(top_k=4)
    from_logits = linear_distill_loss(hidden, weight, teacher, labels, w, chunk_size=5)
    from_top = linear_distill_loss(hidden, weight, top_k_of(teacher, labels, 4), labels, w, chunk_size=3)
    for a, b in zip(from_logits, from_top, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
