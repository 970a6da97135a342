"""Fast generation on token ids: batched prefill, cached decode (CUDA graph on GPU), sampling, streaming.

Public API:
    Engine(model, cuda_graph=True, compile=False, max_seq_len=None)
        .generate(prompts, max_new_tokens=, sampling=, stop_ids=, seed=, num_samples=, should_stop=)
            -> iterator of token columns (one entry per row, None once the row stopped)
        .generate_from(state, ids, ...)   continue a live batch-1 state (chat)
        .new_state(batch, capacity) / .prefill(state, ids [B, T]) / .step(state, tokens [B]) / .clone(state, n)
        .cache_bytes(state)
        .context                          the longest sequence a row reaches (None: no position limit)
        .budgets(lengths, max_new) / .capacity_for(lengths, max_new)   what rows may output, the cache it takes
    generate_tokens(engine, prompts, **kw) -> list of new-token lists
    SamplingParams(temperature=0.0, top_k=0, top_p=1.0), sample_next_token(logits, params, generator)
    TextStream(tokenizer), stream_completion(engine, tokenizer, prompt, ..., on_note=)   text on top of the engine

Modules, each importing only those before it: state, forward, token_sampling (sampling, the device-side
TokenChooser) -> decode_step (the runners) -> decode_loop (the host side of a decode) -> engine -> text -> loading
(`load_model`, `load_engine`; imported by name, not re-exported here).
"""

from zebra.generation.engine import Engine, generate_tokens
from zebra.generation.state import CacheFullError, DecodeState
from zebra.generation.text import TextStream, stream_completion
from zebra.generation.token_sampling import SamplingParams, sample_next_token

__all__ = [
    "CacheFullError",
    "DecodeState",
    "Engine",
    "SamplingParams",
    "TextStream",
    "generate_tokens",
    "sample_next_token",
    "stream_completion",
]
