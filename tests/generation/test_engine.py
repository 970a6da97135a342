"""The engine on CPU against the slow truth: greedy decoding by repeated full forwards."""

from __future__ import annotations

import pytest
import torch
from tests.generation.conftest import greedy_by_full_forwards, tiny_model

from zebra.generation import CacheFullError, Engine, SamplingParams, generate_tokens

PROMPTS = [[5, 17, 99, 3, 250, 42, 7], [8, 120, 64], [33, 1, 200, 77, 150]]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("recipe", ["tiny-gdn", "tiny-kda", "tiny-gla", "tiny-mamba", "tiny"])
def test_cached_greedy_equals_full_forwards(recipe, cache):
    model = tiny_model(recipe)
    engine = Engine(model, cache=cache)
    got = generate_tokens(engine, [PROMPTS[0]], max_new_tokens=8)[0]
    assert got == greedy_by_full_forwards(model, PROMPTS[0], 8)
    assert len(set(got)) > 1  # a model that repeats one token would hide cache bugs


def test_cached_greedy_equals_full_forwards_float32():
    model = tiny_model("tiny", dtype=torch.float32, seed=1)
    got = generate_tokens(Engine(model, cache="static"), [PROMPTS[1]], max_new_tokens=8)[0]
    assert got == greedy_by_full_forwards(model, PROMPTS[1], 8)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_batch_of_different_lengths_equals_one_by_one(hybrid, cache):
    engine = Engine(hybrid, cache=cache)
    batch = generate_tokens(engine, PROMPTS, max_new_tokens=6)
    singles = [generate_tokens(engine, [p], max_new_tokens=6)[0] for p in PROMPTS]
    assert batch == singles
    assert batch[1] == greedy_by_full_forwards(hybrid, PROMPTS[1], 6)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_prefill_once_clone_per_sample(hybrid, cache):
    engine = Engine(hybrid, cache=cache)
    greedy = generate_tokens(engine, [PROMPTS[2]], max_new_tokens=5, num_samples=3)
    assert greedy == [greedy_by_full_forwards(hybrid, PROMPTS[2], 5)] * 3
    warm = SamplingParams(temperature=1.5)
    samples = generate_tokens(engine, [PROMPTS[2]], max_new_tokens=5, num_samples=3, sampling=warm, seed=3)
    assert len({tuple(s) for s in samples}) > 1  # one seeded stream over the rows: the samples differ


def test_sampling_with_a_seed_is_reproducible(hybrid):
    engine = Engine(hybrid)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9)
    first = generate_tokens(engine, PROMPTS, max_new_tokens=8, sampling=params, seed=7)
    again = generate_tokens(engine, PROMPTS, max_new_tokens=8, sampling=params, seed=7)
    other = generate_tokens(engine, PROMPTS, max_new_tokens=8, sampling=params, seed=8)
    assert first == again
    assert first != other


def test_stops_on_stop_ids_and_max_tokens(hybrid):
    engine = Engine(hybrid)
    full = greedy_by_full_forwards(hybrid, PROMPTS[0], 8)
    stop = full[3]
    cut = full.index(stop) + 1
    rows = generate_tokens(engine, [PROMPTS[0], PROMPTS[0]], max_new_tokens=8, stop_ids={stop})
    assert rows == [full[:cut], full[:cut]]
    assert generate_tokens(engine, [PROMPTS[0]], max_new_tokens=2) == [full[:2]]


def test_rows_stop_independently_and_yield_none_after(hybrid):
    engine = Engine(hybrid)
    first = greedy_by_full_forwards(hybrid, PROMPTS[1], 4)
    columns = list(engine.generate([PROMPTS[1], [9, 10, 11]], max_new_tokens=4, stop_ids={first[0]}))
    assert columns[0][0] == first[0]
    assert all(col[0] is None for col in columns[1:])
    assert len(columns) == 4  # the other row runs to max_new_tokens


def test_should_stop_ends_the_stream(hybrid):
    engine = Engine(hybrid)
    seen = []
    for column in engine.generate([PROMPTS[0]], max_new_tokens=50, should_stop=lambda: len(seen) >= 3):
        seen.append(column[0])
    assert len(seen) == 3


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_continuing_a_live_state_equals_full_forwards(hybrid, cache):
    """A chat turn feeds only its new tokens (plus the last unfed reply token) on top of the live cache."""
    engine = Engine(hybrid, cache=cache, max_seq_len=64)
    state = engine.new_state(batch=1)
    reply = [col[0] for col in engine.generate_from(state, PROMPTS[0], max_new_tokens=4)]
    assert state.length == len(PROMPTS[0]) + 3  # every yielded token but the last is in the cache
    turn = [reply[-1], *PROMPTS[1]]
    second = [col[0] for col in engine.generate_from(state, turn, max_new_tokens=4)]
    assert second == greedy_by_full_forwards(hybrid, PROMPTS[0] + reply + PROMPTS[1], 4)


def test_static_cache_capacity_is_enforced(hybrid):
    engine = Engine(hybrid, cache="static", max_seq_len=8)
    state = engine.new_state(batch=1)
    engine.prefill(state, torch.tensor([PROMPTS[0]]))
    engine.step(state, torch.tensor([1]))
    with pytest.raises(CacheFullError, match="cache holds 8 tokens"):
        engine.step(state, torch.tensor([1]))


def test_cache_bytes_static_matches_arch(hybrid):
    from zebra.spec import arch

    engine = Engine(hybrid, cache="static", max_seq_len=40)
    state = engine.new_state(batch=2)
    expected = arch.decode_cache(hybrid.config, 40, dtype_bytes=8, state_dtype_bytes=8)
    # a static conv state keeps all W inputs where the arithmetic counts the W - 1 that carry over
    conv_channels = sum(layer.conv.shape[1] for layer in state.cache.layers if hasattr(layer, "conv"))
    assert engine.cache_bytes(state) == 2 * (expected.per_sequence + conv_channels * 8)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_fused_decode_steps_equal_the_unfused_ones(cache, monkeypatch):
    """`use_fused_decode` hands every sublayer's pre-norm to its mixer's first projection (`rms_norm_linear`: the
    MLP's gate and up with SwiGLU, Mamba2's input projection, GDN's, KDA's and MLA's stacked ones) and runs the
    other projections as `linear_rows`; on the CPU these are the same torch ops, so two rows decode to the same
    logits, bit for bit (the stream handed on from sublayer to sublayer intact), and every sublayer of every step
    took its norm that way. The kernels' own numerics: tests/kernels/test_triton_steps.py."""
    import copy

    import zebra.models.layers.packed as packed
    from zebra.models.layers.packed import use_fused_decode

    model = tiny_model("tiny", dtype=torch.float32, seed=1)  # `*-M-G-K-`
    fused = copy.deepcopy(model)
    assert use_fused_decode(fused) == len(model.config.layer_pattern)  # every mixer has a fused decode form
    calls = []
    real = packed.rms_norm_linear
    monkeypatch.setattr(packed, "rms_norm_linear", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    ids = torch.tensor([PROMPTS[0][:5], PROMPTS[2]])
    runs = []
    for m in (model, fused):
        engine = Engine(m, cache=cache)
        state = engine.new_state(batch=2, capacity=16)
        logits = [engine.prefill(state, ids)]
        for _ in range(4):
            logits.append(engine.step(state, logits[-1].argmax(-1)))
        runs.append(torch.stack(logits))
    assert torch.equal(runs[0], runs[1])
    assert len({tuple(t) for t in runs[1][:, 0].argmax(-1, keepdim=True).tolist()}) > 1  # tokens vary
    sublayer_norms = [
        c for c in calls if c == (2, 1, model.config.hidden_size)
    ]  # MLA's latent norm: narrower
    assert len(sublayer_norms) == 4 * len(model.config.layer_pattern)
