"""ZebraForCausalLM's training-mode loss (chunked linear cross-entropy, no logits) equals the eval-mode loss from
the logits, in value and in every parameter's gradient: `labels` (shifted inside), `shift_labels` (aligned),
ignored tokens and `num_items_in_batch`. float64 tiny models on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.models.tiny import tiny_model


def tokens(model, B=2, T=12, seed=0):
    return torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def loss_and_grads(model, training: bool, **targets):
    model.train(training)
    model.zero_grad()
    out = model(input_ids=targets.pop("input_ids"), use_cache=False, **targets)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


CASES = {
    "labels": lambda ids: {"labels": ids.masked_fill(torch.arange(ids.shape[1]) >= 9, -100)},
    "shift_labels": lambda ids: {"shift_labels": ids.roll(-3, dims=1).masked_fill(ids % 3 == 0, -100)},
    "shift_labels-summed": lambda ids: {"shift_labels": ids.roll(-1, dims=1), "num_items_in_batch": 1},
    "labels-over-items": lambda ids: {"labels": ids, "num_items_in_batch": torch.tensor(7.0)},
}


@pytest.mark.parametrize("name", ["tiny", "tiny-gdn"])
@pytest.mark.parametrize("case", list(CASES))
def test_training_loss_equals_eval_loss_from_logits(name, case):
    model = tiny_model(name)
    ids = tokens(model)
    trained, train_grads = loss_and_grads(model, True, input_ids=ids, **CASES[case](ids))
    evaluated, eval_grads = loss_and_grads(model, False, input_ids=ids, **CASES[case](ids))
    assert trained.logits is None and evaluated.logits.shape == (*ids.shape, model.config.vocab_size)
    torch.testing.assert_close(trained.loss, evaluated.loss, atol=1e-12, rtol=1e-12)
    for n, g in eval_grads.items():
        torch.testing.assert_close(train_grads[n], g, atol=1e-12, rtol=1e-10, msg=n)


def test_shift_labels_are_scored_at_their_own_position():
    model = tiny_model("tiny").train()
    ids = tokens(model)
    shift_labels = ids.roll(-1, dims=1)
    shift_labels[:, -1] = -100
    loss = model(ids, shift_labels=shift_labels, num_items_in_batch=1).loss
    with torch.no_grad():
        logits = model.eval()(ids, use_cache=False).logits  # [B, T, V]
    keep = shift_labels != -100
    expected = F.cross_entropy(logits[keep], shift_labels[keep], reduction="sum")
    torch.testing.assert_close(loss.detach(), expected, atol=1e-12, rtol=1e-12)
    # labels=ids means the same targets, averaged
    mean = model.train()(ids, labels=ids).loss
    torch.testing.assert_close(mean.detach(), expected / keep.sum(), atol=1e-12, rtol=1e-12)


def test_labels_and_shift_labels_together_are_refused():
    model = tiny_model("tiny").train()
    ids = tokens(model)
    with pytest.raises(ValueError, match="not both"):
        model(ids, labels=ids, shift_labels=ids)
