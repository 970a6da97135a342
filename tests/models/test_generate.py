"""generate() and the cache's batch operations: greedy, sampling and beam search with the cache equal the
same searches over full forwards; left-padded batches equal single prompts; reorder/repeat/clone."""

from __future__ import annotations

import torch
from tests.models.tiny import tiny_model

from zebra.models import ZebraCache

NEW = 6


def prompts(model, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        3, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed)
    )


def test_greedy_generate_equals_argmax_over_full_forwards():
    model = tiny_model("tiny")
    ids = prompts(model, 2, 7)
    out = model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    seq = ids
    with torch.no_grad():
        for _ in range(NEW):
            next_token = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, next_token], dim=1)
    assert torch.equal(out, seq)


def test_beam_search_and_sampling_with_cache_equal_without_cache():
    model = tiny_model("tiny", seed=1)
    ids = prompts(model, 2, 5, seed=1)
    common = dict(max_new_tokens=NEW, pad_token_id=0)
    beams = [model.generate(ids, num_beams=3, do_sample=False, use_cache=c, **common) for c in (True, False)]
    assert torch.equal(beams[0], beams[1])  # beam search reorders the cache between steps
    samples = []
    for use_cache in (True, False):
        torch.manual_seed(7)
        samples.append(
            model.generate(ids, do_sample=True, num_return_sequences=2, use_cache=use_cache, **common)
        )
    assert torch.equal(samples[0], samples[1])  # the cache is repeated per returned sequence
    assert samples[0].shape == (4, 5 + NEW)


def test_left_padded_batch_generate_equals_single_prompts():
    model = tiny_model("tiny", seed=2)
    pad = 0
    singles = [prompts(model, 1, n, seed=n) for n in (8, 3, 5)]
    ids = torch.full((3, 8), pad)
    mask = torch.zeros(3, 8, dtype=torch.long)
    for row, p in enumerate(singles):
        ids[row, 8 - p.shape[1] :], mask[row, 8 - p.shape[1] :] = p[0], 1
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=pad)
    for row, p in enumerate(singles):
        alone = model.generate(p, max_new_tokens=NEW, do_sample=False, pad_token_id=pad)
        assert torch.equal(batch[row, 8:], alone[0, p.shape[1] :]), row


def test_generate_with_a_static_cache_equals_dynamic():
    model = tiny_model("tiny", seed=3)
    ids = prompts(model, 2, 6, seed=3)
    dynamic = model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    cache = ZebraCache(model.config, batch_size=2, max_length=6 + NEW, dtype=torch.float64)
    static = model.generate(ids, cache=cache, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    assert torch.equal(static, dynamic)


@torch.no_grad()
def test_reorder_repeat_and_clone():
    model = tiny_model("tiny", seed=4)
    ids = prompts(model, 3, 9, seed=4)
    nxt = prompts(model, 3, 1, seed=5)
    for static in (False, True):
        kwargs = dict(batch_size=3, max_length=12, dtype=torch.float64) if static else {}
        cache = ZebraCache(model.config, **kwargs)
        model(ids, cache=cache)
        copy = cache.clone()
        expected = model(nxt, cache=cache).logits
        assert cache.get_seq_length() == 10 and copy.get_seq_length() == 9  # the clone did not move
        # reorder: permuting the cache rows permutes the next step's outputs
        perm = torch.tensor([2, 0, 1])
        copy.reorder_cache(perm)
        permuted = copy.clone()
        torch.testing.assert_close(
            model(nxt[perm], cache=permuted).logits, expected[perm], atol=1e-12, rtol=0
        )
        # repeat: one prompt's cache serves several samples
        copy.batch_repeat_interleave(2)
        assert copy.batch_size == 6
        repeated = model(nxt[perm].repeat_interleave(2, 0), cache=copy).logits
        torch.testing.assert_close(repeated, expected[perm].repeat_interleave(2, 0), atol=1e-12, rtol=0)
        cache.reset()
        assert cache.get_seq_length() == 0
        torch.testing.assert_close(model(ids, cache=cache).logits, model(ids, use_cache=False).logits)
