"""Decoding with the cache equals full forwards (float64, torch kernels): token by token, prefill + decode,
chunked prefill, the static cache, left padding and packed sequences."""

from __future__ import annotations

import pytest
import torch
from tests.models.tiny import TINY_RECIPES, tiny_model

from zebra.models import ZebraCache

ATOL = 1e-9


def full_logits(model, ids, **kwargs) -> torch.Tensor:
    """One forward over the whole sequence with grad enabled, so the recurrent kernels take the chunked path
    (decoding without grad takes the recurrent one)."""
    with torch.enable_grad():
        return model(ids, use_cache=False, **kwargs).logits.detach()


@torch.no_grad()
def decode(model, ids, cache, chunks) -> torch.Tensor:
    """Feed `ids` in pieces of the given lengths through `cache`; logits of every position."""
    out, start = [], 0
    for n in chunks:
        out.append(model(ids[:, start : start + n], cache=cache, use_cache=True).logits)
        start += n
    assert start == ids.shape[1]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("name", TINY_RECIPES)
def test_token_by_token_decode_equals_full_forward(name):
    T = 24
    model = tiny_model(name)
    ids = torch.randint(0, model.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    full = full_logits(model, ids)
    cache = ZebraCache(model.config)
    stepped = decode(model, ids, cache, [1] * T)
    torch.testing.assert_close(stepped, full, atol=ATOL, rtol=0)
    assert cache.get_seq_length() == T


def test_prefill_then_decode_and_chunks_equal_full_forward():
    model = tiny_model("tiny", seed=3)  # the hybrid: every mixer kind
    ids = torch.randint(0, model.config.vocab_size, (2, 80), generator=torch.Generator().manual_seed(2))
    full = full_logits(model, ids)  # 80 > 64 tokens: the chunked kernels span two chunks
    # chunked prefill (66 tokens), 3 more with a non-empty cache, single tokens, then 9 at once
    got = decode(model, ids, ZebraCache(model.config), [66, 3, 1, 1, 9])
    torch.testing.assert_close(got, full, atol=ATOL, rtol=0)


def test_static_cache_equals_dynamic_cache():
    model = tiny_model("tiny", seed=4)
    ids = torch.randint(0, model.config.vocab_size, (3, 16), generator=torch.Generator().manual_seed(3))
    dynamic = decode(model, ids, ZebraCache(model.config), [8, 1, 1, 6])
    static = ZebraCache(model.config, batch_size=3, max_length=26, dtype=torch.float64)
    buffers = [t.data_ptr() for layer in static.layers if layer is not None for t in layer.tensors().values()]
    got = decode(model, ids, static, [8, 1, 1, 6])
    torch.testing.assert_close(got, dynamic, atol=ATOL, rtol=0)
    assert static.get_seq_length() == 16 and int(static.offset_tensor) == 16
    # updated in place: the same buffers, so a captured CUDA graph would see the new values
    assert buffers == [
        t.data_ptr() for layer in static.layers if layer is not None for t in layer.tensors().values()
    ]
    with pytest.raises(ValueError, match="static ZebraCache is full"):
        decode(model, ids[:, :11], static, [11])


@pytest.mark.parametrize("name", TINY_RECIPES)
def test_left_padded_batch_equals_individual_sequences(name):
    model = tiny_model(name, seed=5)
    gen = torch.Generator().manual_seed(4)
    lengths, width, new = [9, 5, 2], 9, 3
    seqs = [torch.randint(0, model.config.vocab_size, (n + new,), generator=gen) for n in lengths]
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
        ids[row, width - n :], mask[row, width - n :] = seq[:n], 1
    with torch.no_grad():
        cache = ZebraCache(model.config)
        prefill = model(ids, attention_mask=mask, cache=cache).logits
        steps = []
        for t in range(new):
            mask = torch.cat([mask, torch.ones(len(seqs), 1, dtype=torch.long)], dim=1)
            token = torch.stack([seq[n + t] for seq, n in zip(seqs, lengths, strict=True)])[:, None]
            steps.append(model(token, attention_mask=mask, cache=cache).logits)
    for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
        alone = full_logits(model, seq[None])[0]  # [n + new, V]
        torch.testing.assert_close(prefill[row, width - n :], alone[:n], atol=ATOL, rtol=0)
        torch.testing.assert_close(torch.cat([s[row] for s in steps]), alone[n:], atol=ATOL, rtol=0)


def test_packed_sequences_equal_separate_sequences():
    model = tiny_model("tiny", seed=6)
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n in (7, 12, 4)]
    cu_seqlens = torch.tensor([0, 7, 19, 23])
    packed = full_logits(model, torch.cat(seqs)[None], cu_seqlens=cu_seqlens)[0]
    separate = torch.cat([full_logits(model, s[None])[0] for s in seqs])
    torch.testing.assert_close(packed, separate, atol=ATOL, rtol=0)


def test_a_step_with_feed_off_leaves_the_static_cache_as_it_was():
    """The decode loop may launch a step before it knows the sequence ended; with `feed` False that step changes
    no state and no offset, so decoding continues exactly as if it never ran."""
    model = tiny_model("tiny", seed=6)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
    full = full_logits(model, ids)
    cache = ZebraCache(model.config, batch_size=2, max_length=12, dtype=torch.float64)
    first = decode(model, ids[:, :8], cache, [7, 1])
    before = [t.clone() for layer in cache.layers if layer is not None for t in layer.tensors().values()]
    before = [t for t in before if t.shape[1] != 12]  # recurrent and conv states (latents are slot-addressed)
    cache.feed.fill_(False)
    with torch.no_grad():
        model(ids[:, 8:9], cache=cache)  # a step whose token must not enter the cache
    cache.uncount(1)
    after = [
        t for layer in cache.layers if layer is not None for t in layer.tensors().values() if t.shape[1] != 12
    ]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert int(cache.offset_tensor) == cache.get_seq_length() == 8
    cache.feed.fill_(True)
    rest = decode(model, ids[:, 8:], cache, [1, 1, 1, 1])
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["tiny", "tiny-mamba"])
def test_a_bf16_static_cache_keeps_conv_states_in_bf16_and_decodes_as_the_dynamic_one(name):
    """Conv states hold raw bf16 inputs: stored in bf16 (no cast per step) they lose nothing, so the static cache
    gives the same logits as the dynamic one, whose conv states are float32 (the same kernel on the same values)."""
    model = tiny_model(name, seed=7).to(torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(6))
    static = ZebraCache(model.config, batch_size=2, max_length=10, dtype=torch.bfloat16)
    convs = [layer.conv for layer in static.layers if getattr(layer, "conv", None) is not None]
    assert convs and all(c.dtype == torch.bfloat16 for c in convs)
    dynamic = ZebraCache(model.config)
    got, want = decode(model, ids, static, [6, 1, 1, 1, 1]), decode(model, ids, dynamic, [6, 1, 1, 1, 1])
    assert all(
        layer.conv.dtype == torch.float32
        for layer in dynamic.layers
        if getattr(layer, "conv", None) is not None
    )
    assert torch.equal(got, want)
