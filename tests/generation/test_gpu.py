"""The CUDA-graph decode path (GPU only): same tokens as eager decoding, and the step really is replayed."""

from __future__ import annotations

import pytest
import torch

from zebra.generation import Engine, SamplingParams, generate_tokens

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 17, 99, 3, 250, 42, 7], [8, 120, 64]]


def cuda_model(recipe: str, dtype: torch.dtype, backend: str = "auto"):
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    torch.manual_seed(0)
    config = load_recipe(recipe).model.to_config(
        tie_word_embeddings=False, initializer_range=0.2, kernel_backend=backend
    )
    with torch.device("cuda"):
        model = ZebraForCausalLM(config)
    return model.to(dtype).eval()


class ForwardCounter:
    """Counts Python-level calls of the model's forward (a replayed CUDA graph makes none)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


@pytest.mark.parametrize("recipe", ["tiny", "tiny-gdn", "tiny-kda", "tiny-gla", "tiny-mamba"])
def test_cuda_graph_decode_equals_eager_decode(recipe):
    model = cuda_model(recipe, torch.float32)
    graph = Engine(model, cache="static", cuda_graph=True)
    eager = Engine(model, cache="static", cuda_graph=False)
    dynamic = Engine(model, cache="dynamic")
    assert graph.cuda_graph and not eager.cuda_graph
    want = generate_tokens(eager, PROMPTS, max_new_tokens=24)
    assert generate_tokens(graph, PROMPTS, max_new_tokens=24) == want
    assert generate_tokens(dynamic, PROMPTS, max_new_tokens=24) == want
    assert len({t for row in want for t in row}) > 2


def test_decode_step_is_captured_and_replayed():
    model = cuda_model("tiny", torch.float32)
    engine = Engine(model)  # auto: static cache + CUDA graph on a GPU
    assert engine.cache_kind == "static" and engine.cuda_graph
    state = engine.new_state(batch=2, capacity=64)
    assert isinstance(engine.runner._slots[2].graph, torch.cuda.CUDAGraph)
    counter = ForwardCounter(model)
    engine.prefill(state, torch.tensor([PROMPTS[0][:3], PROMPTS[1]]))
    for _ in range(10):
        engine.step(state, state.logits.argmax(-1))
    assert counter.calls == 1  # the prefill; the ten steps were graph replays
    assert state.length == 13 and state.cache.seen_tokens == 13
    assert int(state.cache.offset_tensor) == 13


def test_the_step_profile_follows_timed_runs_in_inference_mode():
    # `zebra bench decode --profile` failed on a GPU after the timed runs: they make the graphed slot in inference
    # mode, and the profile asked for a state (a reset of that slot) outside it
    from zebra.bench.decode_profile import profile_step

    model = cuda_model("tiny", torch.float32)
    engine = Engine(model, max_seq_len=64)
    prompts = torch.tensor(PROMPTS[:1])
    with torch.inference_mode():
        state = engine.new_state(batch=1, capacity=prompts.shape[1] + 8)
        engine.prefill(state, prompts.cuda())
    profile = profile_step(engine, prompts, 8)
    assert profile.mode == "cuda graph" and profile.steps > 0


def test_chat_state_continues_across_turns_with_the_graph():
    model = cuda_model("tiny", torch.float32)
    graph, eager = Engine(model, max_seq_len=128), Engine(model, cache="dynamic")
    outs = []
    for engine in (graph, eager):
        state = engine.new_state(batch=1)
        first = [c[0] for c in engine.generate_from(state, PROMPTS[0], max_new_tokens=6)]
        second = [c[0] for c in engine.generate_from(state, [first[-1], *PROMPTS[1]], max_new_tokens=6)]
        outs.append((first, second))
    assert outs[0] == outs[1]


def test_1b_gdn_pure_bf16_graph_equals_eager():
    model = cuda_model("1b-gdn-pure", torch.bfloat16)
    prompt = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
    ids = [prompt[0].tolist()]
    graph = generate_tokens(Engine(model, cuda_graph=True), ids, max_new_tokens=32)
    eager = generate_tokens(Engine(model, cache="static", cuda_graph=False), ids, max_new_tokens=32)
    assert graph == eager


def prompts_of(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def test_graph_decode_over_growing_and_shrinking_requests_equals_eager():
    """Issue 15 item 17: a later request that needs a larger cache used to crash the next graph capture (a
    released graph's shared pool). Slots now regrow with their own pools; every output still equals eager decode.
    A request past max_seq_len (the engine's context) stops there and fits the largest bucket."""
    model = cuda_model("tiny", torch.float32)
    graph = Engine(model, max_seq_len=256)  # buckets up to 256 tokens, the longest sequence
    eager = Engine(model, cache="static", cuda_graph=False, max_seq_len=256)
    requests = [
        ([7], 8),
        ([7], 1),
        ([7], 100),
        ([5, 9], 30),
        ([7], 3),
        ([9, 4, 6], 70),
        ([5, 9], 4),
        ([7], 200),
        ([7], 1_000_000),
    ]
    capacities = []
    for i, (lengths, new) in enumerate(requests):
        prompts = prompts_of(lengths, model.config.vocab_size, seed=i)
        want = generate_tokens(eager, prompts, max_new_tokens=new)
        assert generate_tokens(graph, prompts, max_new_tokens=new) == want, (lengths, new)
        assert [len(row) for row in want] == [min(new, 256 - n) for n in lengths]
        capacities.append(graph.runner._slots[1].cache.max_length)
    assert capacities == [16, 16, 128, 128, 128, 128, 128, 256, 256]  # regrown twice, reused when shrinking
    assert all(isinstance(slot.graph, torch.cuda.CUDAGraph) for slot in graph.runner._slots.values())


def test_1b_gdn_pure_requests_of_8_then_1_then_256_tokens_after_2048():
    """The sequence of issue 15 item 17, which crashed regrowing the slot. A pure-GDN cache has the same size
    for any length, so its slot is now made once and never regrown; the graph still equals eager decode."""
    model = cuda_model("1b-gdn-pure", torch.bfloat16)
    prompt = prompts_of([2048], model.config.vocab_size, seed=0)
    graph = Engine(model, max_seq_len=2049)
    eager = Engine(model, cache="static", cuda_graph=False, max_seq_len=2049)
    caches = []
    for new in (8, 1, 256):
        assert generate_tokens(graph, prompt, max_new_tokens=new) == generate_tokens(
            eager, prompt, max_new_tokens=new
        )
        caches.append(graph.runner._slots[1].cache)
    assert caches[0] is caches[1] is caches[2] and caches[0].max_length == 2056


def test_a_million_new_tokens_on_a_hybrid_stop_at_its_context():
    """`zebra generate --max-new 1000000` on a model with MLA: the cache is sized for the context (1024 in tiny),
    not for a million tokens, and decoding stops there."""
    model = cuda_model("tiny", torch.float32)
    engine = Engine(model)
    columns = []
    for column in engine.generate(
        PROMPTS[:1], max_new_tokens=1_000_000, should_stop=lambda: len(columns) > 2000
    ):
        columns.append(column)
    assert len(columns) == 1024 - len(PROMPTS[0])
    assert engine.runner._slots[1].cache.max_length == 1024


def test_a_pure_recurrent_graph_decodes_past_the_configured_length_without_a_new_slot():
    """`zebra generate --max-new 1000000` on a pure-GDN model: no context, a cache of the same size whatever was
    asked for, and the graph keeps decoding past max_position_embeddings (1024 in tiny-gdn)."""
    model = cuda_model("tiny-gdn", torch.float32)
    engine = Engine(model)
    assert engine.context is None
    before = torch.cuda.memory_allocated()
    columns = []
    for column in engine.generate(
        PROMPTS[:1], max_new_tokens=1_000_000, should_stop=lambda: len(columns) >= 1100
    ):
        columns.append(column)
    assert len(columns) == 1100
    assert torch.cuda.memory_allocated() - before < 64 * 2**20  # states, graphs, pools: not a million tokens


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_k=50, top_p=0.9)],
    ids=["plain", "filtered"],
)
def test_seeded_sampling_in_the_graph_equals_eager_sampling(params):
    """The captured chooser draws from the slot's generator exactly as the eager one does (Philox offsets)."""
    model = cuda_model("tiny", torch.float32)
    prompts = prompts_of([7, 3], model.config.vocab_size, seed=1)
    graph, eager = Engine(model), Engine(model, cache="static", cuda_graph=False)
    runs = [
        generate_tokens(e, prompts, max_new_tokens=24, sampling=params, seed=7) for e in (graph, eager, graph)
    ]
    assert runs[0] == runs[1] == runs[2]
    assert generate_tokens(graph, prompts, max_new_tokens=24, sampling=params, seed=8) != runs[0]


def test_a_stop_id_on_the_graph_loop_leaves_the_state_as_eager_decode():
    model = cuda_model("tiny", torch.float32)
    graph, dynamic = Engine(model, max_seq_len=128), Engine(model, cache="dynamic")
    probe = [c[0] for c in dynamic.generate_from(dynamic.new_state(batch=1), PROMPTS[0], max_new_tokens=8)]
    outs = []
    for engine in (graph, dynamic):
        state = engine.new_state(batch=1)
        first = [c[0] for c in engine.generate_from(state, PROMPTS[0], max_new_tokens=8, stop_ids={probe[3]})]
        second = [c[0] for c in engine.generate_from(state, PROMPTS[1], max_new_tokens=8)]
        outs.append((first, second, state.length))
    assert outs[0] == outs[1] and outs[0][0] == probe[:4]


def test_the_generate_loop_does_not_synchronise_per_token():
    """After the first column, token choice, the copy to the host and stop checks run without a host sync
    (torch's sync debug mode raises on .item(), .tolist() of a GPU tensor, blocking copies)."""
    model = cuda_model("tiny-gdn", torch.float32)
    engine = Engine(model)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    list(engine.generate(PROMPTS, max_new_tokens=4, sampling=params, seed=0))  # captures
    columns = engine.generate(PROMPTS, max_new_tokens=40, sampling=params, seed=0, stop_ids={1, 2})
    next(columns)
    torch.cuda.set_sync_debug_mode("error")
    try:
        rest = list(columns)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert rest


def test_fla_twin_is_flas_own_class_on_the_same_weights():
    from zebra.bench.decode import fla_twin

    model = cuda_model("tiny-gdn", torch.float32, backend="fla")
    twin, note = fla_twin(model)
    assert type(twin).__name__ == "GatedDeltaNetForCausalLM" and "zebra convert --to fla" in note
    ids = torch.tensor(prompts_of([64], model.config.vocab_size, seed=2), device="cuda")
    with torch.no_grad():
        a, b = model(input_ids=ids).logits.float(), twin(input_ids=ids).logits.float()
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.9999


@pytest.mark.parametrize("recipe", ["tiny", "tiny-gdn"])
def test_fused_decode_graph_equals_unfused(recipe):
    """`use_fused_decode` (Zebra's GEMV kernels, tuned in the eager warm-up, then captured in the step's graph):
    float32 greedy tokens equal the unfused engine's, and the step's logits agree to float32 sums."""
    import copy

    from zebra.models.layers.packed import use_fused_decode

    model = cuda_model(recipe, torch.float32)
    fused = copy.deepcopy(model)
    use_fused_decode(fused)
    engines = [Engine(m, cache="static", cuda_graph=True) for m in (model, fused)]
    want = generate_tokens(engines[0], PROMPTS, max_new_tokens=24)
    assert generate_tokens(engines[1], PROMPTS, max_new_tokens=24) == want
    states = [e.new_state(batch=1, capacity=32) for e in engines]
    logits = [e.prefill(s, torch.tensor([PROMPTS[0]])) for e, s in zip(engines, states, strict=True)]
    steps = [e.step(s, lg.argmax(-1)) for e, s, lg in zip(engines, states, logits, strict=True)]
    torch.testing.assert_close(steps[1], steps[0], rtol=1e-4, atol=1e-4)


def test_argmax_rows_on_the_gpu_keeps_the_first_maximum():
    """The two-stage greedy choice on CUDA (whose reductions order ties their own way) against `argmax`."""
    from zebra.generation.token_sampling import argmax_rows

    gen = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn(8, 128256, generator=gen, device="cuda")
    scores[1, [5, 128000]] = scores[1].max() + 1
    scores[2] = 0.0
    scores[3, 2003] = scores[3, 2004] = scores[3].max() + 1  # the end of block 0 and the start of block 1
    for x in (scores, scores.bfloat16()):
        assert torch.equal(argmax_rows(x), x.argmax(-1))
