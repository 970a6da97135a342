"""The static runner on CPU (the CUDA-graph path's non-graph twin): one slot per batch size sized by power-of-two
buckets, reused and regrown across requests, and the lagged decode loop (a step launched before the host read
the token that may end the stream) leaving the state exactly as a token-by-token decode would."""

from __future__ import annotations

import pytest
import torch
from tests.generation.conftest import greedy_by_full_forwards

from zebra.generation import Engine, SamplingParams, generate_tokens
from zebra.generation.decode_step import bucket_capacity

PROMPT = [5, 17, 99, 3, 250, 42, 7]


def test_bucket_capacity_rounds_up_to_a_power_of_two_below_the_limit():
    assert [bucket_capacity(n, 4096) for n in (1, 2, 3, 15, 16, 17, 2056)] == [1, 2, 4, 16, 16, 32, 4096]
    assert bucket_capacity(2056, 2100) == 2100  # not past max_seq_len ...
    assert bucket_capacity(2304, 2100) == 2304  # ... unless the request itself is longer


def test_requests_share_a_slot_until_one_needs_more(hybrid):
    engine = Engine(hybrid, cache="static", max_seq_len=64)
    slots = engine.runner._slots
    got = generate_tokens(engine, [PROMPT], max_new_tokens=8)  # 15 tokens: a 16-slot cache
    first = slots[1].cache
    assert first.max_length == 16
    assert generate_tokens(engine, [PROMPT], max_new_tokens=1)[0] == got[0][:1]
    assert slots[1].cache is first  # shrinking reuses the slot
    longer = generate_tokens(engine, [PROMPT], max_new_tokens=20)[0]  # 27 tokens: regrown to 32
    assert slots[1].cache is not first and slots[1].cache.max_length == 32
    assert longer == greedy_by_full_forwards(hybrid, PROMPT, 20)
    pair = generate_tokens(engine, [PROMPT, PROMPT[:3]], max_new_tokens=4)  # batch 2: a slot of its own
    assert set(slots) == {1, 2} and slots[1].cache.max_length == 32
    assert pair == [greedy_by_full_forwards(hybrid, p, 4) for p in (PROMPT, PROMPT[:3])]
    assert generate_tokens(engine, [PROMPT], max_new_tokens=8) == got  # back to batch 1, the 32-slot cache


def test_a_state_of_a_released_slot_cannot_step(hybrid):
    engine = Engine(hybrid, cache="static", max_seq_len=16)
    old = engine.new_state(batch=1, capacity=8)
    engine.prefill(old, torch.tensor([PROMPT]))
    engine.new_state(batch=1, capacity=40)  # needs a bigger slot: the old one is released
    with pytest.raises(RuntimeError, match="replaced by a newer state"):
        engine.step(old, torch.tensor([1]))


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_stop_id_ends_the_stream_and_leaves_only_the_tokens_before_it_in_the_cache(hybrid, cache):
    engine = Engine(hybrid, cache=cache, max_seq_len=64)
    full = greedy_by_full_forwards(hybrid, PROMPT, 8)
    state = engine.new_state(batch=1)
    reply = [c[0] for c in engine.generate_from(state, PROMPT, max_new_tokens=8, stop_ids={full[2]})]
    assert reply == full[:3]  # nothing after the stop id
    assert state.length == len(PROMPT) + 2 and state.unfed == full[2]
    if cache == "static":  # the step launched ahead fed nothing: host and device counts agree
        assert state.cache.seen_tokens == int(state.cache.offset_tensor) == state.length
        assert bool(state.cache.feed) and state.logits is None
    nxt = [8, 120, 64]
    again = [c[0] for c in engine.generate_from(state, nxt, max_new_tokens=4)]
    assert again == greedy_by_full_forwards(hybrid, PROMPT + full[:2] + nxt, 4)


def test_should_stop_on_the_lagged_loop_feeds_every_output_token(hybrid):
    engine = Engine(hybrid, cache="static", max_seq_len=64)
    state, seen = engine.new_state(batch=1), []
    for column in engine.generate_from(state, PROMPT, max_new_tokens=20, should_stop=lambda: len(seen) >= 3):
        seen.append(column[0])
    assert len(seen) == 3 and state.unfed is None and state.length == len(PROMPT) + 3
    again = [c[0] for c in engine.generate_from(state, [9], max_new_tokens=3)]
    assert again == greedy_by_full_forwards(hybrid, PROMPT + seen + [9], 3)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_reply_stops_where_the_sequence_fills_max_seq_len(hybrid, cache):
    """A live state's reply ends when prompt + reply reach max_seq_len (the engine's context), as it ends at
    max_new_tokens: no CacheFullError in the middle of a stream, and the same tokens on either cache."""
    engine = Engine(hybrid, cache=cache, max_seq_len=10)
    state = engine.new_state(batch=1)
    seen = [column[0] for column in engine.generate_from(state, PROMPT, max_new_tokens=8)]
    full = greedy_by_full_forwards(hybrid, PROMPT, 3)
    assert seen == full  # 7 + 3 = 10 tokens
    assert state.length == 9 and state.unfed == full[-1]  # the last one is not fed: the cache never overflows
    if cache == "static":  # a full cache ends the next reply before its first token, without raising
        assert list(engine.generate_from(state, [state.unfed], max_new_tokens=8)) == []


def test_seeded_sampling_is_the_same_on_the_lagged_static_loop_and_the_dynamic_one(hybrid):
    params = SamplingParams(temperature=1.0, top_k=40, top_p=0.9)
    prompts = [PROMPT, [8, 120, 64]]
    runs = [
        generate_tokens(Engine(hybrid, cache=c), prompts, max_new_tokens=6, sampling=params, seed=5)
        for c in ("static", "dynamic")
    ]
    assert runs[0] == runs[1]
