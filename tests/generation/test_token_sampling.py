"""Token choice on the device: the same tokens as the previous host-side sampler for the same seed, and the
chooser's stop and budget bookkeeping (what lets the decode loop read tokens a step late)."""

from __future__ import annotations

import pytest
import torch

from zebra.generation import SamplingParams, sample_next_token
from zebra.generation.token_sampling import TokenChooser, argmax_rows


def multinomial_sampler(logits, params, generator):
    """The sampler before the device-side one (kept here as the oracle): top-k by the k-th score (ties kept),
    top-p over what top-k left, then torch.multinomial."""
    if params.greedy:
        return logits.argmax(dim=-1)
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        drop_sorted = probs.cumsum(dim=-1) - probs >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator).squeeze(-1)


PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=20),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=50, top_p=0.9),
]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"{p.kind}-k{p.top_k}-p{p.top_p}")
def test_same_tokens_as_the_multinomial_sampler_for_a_seed(params):
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(0)) * 3
    mine, theirs = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    for _ in range(20):  # the two draw the same random numbers step after step
        got = sample_next_token(logits, params, mine)
        assert torch.equal(got, multinomial_sampler(logits, params, theirs))


def test_filters_keep_only_allowed_tokens_and_tensor_limits_match_numbers():
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    top5 = set(logits[0].topk(5).indices.tolist())
    chooser = TokenChooser(2, 64, torch.device("cpu"), stop_slots=8)
    params = SamplingParams(temperature=2.0, top_k=5)
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    chooser.start(params, set(), 1000, gen_a)
    for _ in range(200):
        chooser.choose(logits)  # the limits as 0-d tensors, as in a captured graph
        token = chooser.tokens[:, 0]
        assert token[0].item() in top5
        assert torch.equal(token, sample_next_token(logits, params, gen_b))


def test_chooser_stops_rows_on_stop_ids_and_budgets():
    logits = torch.full((3, 10), -5.0)
    logits[0, 7] = logits[1, 2] = logits[2, 4] = 5.0  # greedy picks 7, 2, 4
    chooser = TokenChooser(3, 10, torch.device("cpu"), stop_slots=8)
    chooser.start(SamplingParams(), {2}, 2, None)
    chooser.emitting.copy_(torch.tensor([True, True, False]))  # row 2 still feeds its prompt
    chooser.choose(logits)
    assert chooser.tokens[:, 0].tolist() == [7, 2, 4]
    assert chooser.stopped.tolist() == [False, True, False] and bool(chooser.running)
    assert chooser.remaining.tolist() == [1, 1, 2]  # row 1 stopped on its stop id, row 2 output nothing
    chooser.emitting.fill_(True)
    chooser.choose(logits)
    assert chooser.stopped.tolist() == [True, True, False]  # row 0 spent its budget of 2
    chooser.choose(logits)
    assert chooser.stopped.tolist() == [True, True, True] and not bool(chooser.running)


def test_start_refuses_more_stop_ids_than_slots():
    chooser = TokenChooser(1, 10, torch.device("cpu"), stop_slots=2)
    with pytest.raises(ValueError, match="at most 2 stop ids"):
        chooser.start(SamplingParams(), {1, 2, 3}, 4, None)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -0.5])
def test_sampling_params_refuse_a_temperature_that_is_not_finite_and_at_least_zero(temperature):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("vocab", [300, 49152, 128256, 49152 + 1])  # one stage; two; two; not divisible: one
def test_argmax_rows_is_argmax_with_its_first_index_on_ties(vocab):
    gen = torch.Generator().manual_seed(vocab)
    scores = torch.randn(6, vocab, generator=gen)
    scores[1, [5, vocab - 3]] = scores[1].max() + 1  # a tie across blocks: the first wins
    scores[2] = 0.0  # every token tied: index 0
    scores[3, -1] = float("inf")  # the last index of the last block
    scores[4, 0] = float("nan")  # argmax counts NaN as the maximum
    scores[5, 2 * (vocab // 64) - 1] = scores[5].max() + 1  # the last index of a block
    last_of_three = torch.randn(6, 3, vocab, generator=gen)
    last_of_three[:, 2] = scores  # a model's last-position logits: a view whose rows are not adjacent
    column_major = scores.T.contiguous().T  # stride 1 along the rows: the one-stage fallback
    for x in (scores, scores.bfloat16(), last_of_three[:, 2], column_major):
        assert torch.equal(argmax_rows(x), x.argmax(-1))
