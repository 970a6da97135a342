"""Fast generation on token ids: batched prefill, cached decode (CUDA graph on GPU), sampling, streaming.

Public API:
    Engine(model, cuda_graph=True, compile=False, max_seq_len=None)
        .generate(prompts, max_new_tokens=, sampling=, stop_ids=, seed=, num_samples=, should_stop=)
            -> iterator of token columns (one entry per row, None once the row stopped)
        .generate_from(state, ids, ...)   continue a live batch-1 state (chat)
        .new_state(batch, capacity) / .prefill(state, ids [B, T]) / .step(state, tokens [B]) / .clone(state, n)
        .cache_bytes(state)
    generate_tokens(engine, prompts, **kw) -> list of new-token lists
    SamplingParams(temperature=0.0, top_k=0, top_p=1.0), sample_next(logits, params, generator)
"""

from zebra.generation.engine import CacheFullError, DecodeState, Engine, generate_tokens
from zebra.generation.sampling import SamplingParams, sample_next

__all__ = ["CacheFullError", "DecodeState", "Engine", "SamplingParams", "generate_tokens", "sample_next"]
