"""zebra.eval.ce.heldout_ce: the held-out CE every upcycling figure reports."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from zebra.eval.ce import heldout_ce


class Bigram(torch.nn.Module):
    """A next-token model whose logits depend on the current token only (and dropout, to show eval mode)."""

    def __init__(self, vocab: int = 11):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, vocab)  # a matmul: bf16 under autocast
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, input_ids, use_cache=False):
        return SimpleNamespace(logits=self.head(self.drop(self.embed(input_ids))))  # [b, seq, V]


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_the_mean_over_every_window_whatever_the_batch(batch):
    torch.manual_seed(0)
    model = Bigram().train()
    windows = torch.randint(0, 11, (7, 9))  # 7 windows of 8 tokens in, 8 labels
    logits = model.head(model.embed(windows[:, :-1]))  # [7, 8, V]
    expected = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert heldout_ce(model, windows, batch=batch) == pytest.approx(expected, rel=1e-6)
    assert not model.training  # dropout off: the same number on every call


def test_bf16_autocast_is_close_to_float32():
    torch.manual_seed(0)
    model, windows = Bigram(), torch.randint(0, 11, (4, 17))
    full, half = heldout_ce(model, windows, "cpu"), heldout_ce(model, windows, "cpu", bf16=True)
    assert half != full and half == pytest.approx(full, abs=0.05)
