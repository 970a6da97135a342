"""The CUDA-graph decode path (GPU only): same tokens as eager decoding, and the step really is replayed."""

from __future__ import annotations

import pytest
import torch

from zebra.generation import Engine, generate_tokens

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


@pytest.mark.parametrize("recipe", ["tiny", "tiny-gdn", "tiny-kda", "tiny-mamba"])
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
