"""The generation engine: token ids in, token ids out, over the model's hybrid cache.

The engine knows nothing about text (nanochat's rule). It owns one model and runs three operations on a
`DecodeState` (a cache plus the number of tokens it holds):

    prefill    feed T tokens of every row at once (the chunked kernels)            [B, T] -> logits [B, V]
    step       feed one token per row (recurrent kernels; a CUDA graph on GPU)    [B]    -> logits [B, V]
    clone      repeat every row n times (prefill once, sample many)

Every row of a state holds the same number of tokens. A batch of prompts of different lengths is prefilled up to
the shortest one together; the remaining prompt tokens are forced through decode steps (Meta's Llama reference
does the same), so no padding ever enters a recurrent state and each row equals its own batch-1 run.

A model whose layers have a position limit (attention with RoPE: MLA, a transformer) has a context, `Engine.context`
(its `max_position_embeddings`): a row stops when its sequence reaches it, as it stops after `max_new_tokens`, so a
static cache is never sized past it however many tokens are asked for. A prompt already at or past the context is
still fed whole and continued, for at most `context` new tokens (`Engine.budgets`). A model of recurrent layers
only (GDN, KDA, Mamba2) has no positions and no context: its generation is bounded by `max_new_tokens` alone, and
its static cache has the same size whatever the length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from zebra.generation.decode_loop import DecodeLoop
from zebra.generation.decode_step import DecodeRunner, StaticRunner
from zebra.generation.forward import logits_forward
from zebra.generation.state import DecodeState
from zebra.generation.token_sampling import SamplingParams
from zebra.mixers import keeps_tokens

# A prefill feeds at most this many (query, key) pairs at once: chunks of PREFILL_PAIRS // length tokens (at least
# PREFILL_MIN_CHUNK), so a 4k prompt goes in one piece and a million-token one in pieces of 16.
PREFILL_PAIRS = 1 << 24
PREFILL_MIN_CHUNK = 16


def position_limit(config: Any) -> int | None:
    """The context of a model whose layers have a position limit: its `max_position_embeddings` when it has
    attention layers (MLA in a zebra model, an FLA model's `attn` layers, any transformers model declaring one);
    None for a model of recurrent layers only (zebra's GDN / KDA / Mamba2, FLA's models without `attn`)."""
    if getattr(config, "model_type", None) == "zebra":
        positioned = keeps_tokens(config.layer_pattern)
    elif hasattr(config, "attn"):  # FLA's recurrent families: hybrid only when `attn` names attention layers
        positioned = bool(config.attn)
    else:
        positioned = True
    limit = getattr(config, "max_position_embeddings", None) if positioned else None
    return int(limit) if limit else None


class Engine:
    """Prefill, decode and sample with one model; see the module docstring.

    Args:
        model: a causal LM taking `(input_ids, past_key_values, use_cache)` (ZebraForCausalLM, FLA, HF).
        cache: `static` (a pre-allocated `ZebraCache`, zebra models only), `dynamic` (the model's growing cache),
            or `auto`: static on a GPU for zebra models, dynamic otherwise.
        cuda_graph: capture the decode step in a CUDA graph (static cache on a GPU only).
        compile: `torch.compile` the decode step before its CUDA-graph capture (ignored without a graph).
        max_seq_len: the context (see `context`) in place of the model's own, and the capacity of the static
            caches of `new_state` (chat); `generate` sizes them to prompt + new tokens rounded up to a power of two,
            but not past this (so requests of similar lengths share one cache and graph). Default: the model's
            `max_position_embeddings` (4096 without one).

    Attributes:
        context: the longest sequence (prompt + new tokens) a row reaches before it stops, for a model whose
            layers have a position limit (`position_limit`): `max_seq_len` when given, else the model's
            `max_position_embeddings`. None for a model of recurrent layers only: no limit.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        cache: str = "auto",
        cuda_graph: bool = True,
        compile: bool = False,
        max_seq_len: int | None = None,
    ):
        self.model = model.eval()
        self.config = model.config
        self.device = next(model.parameters()).device
        limit = position_limit(self.config)
        self.context = (max_seq_len or limit) if limit else None
        self.max_seq_len = max_seq_len or getattr(self.config, "max_position_embeddings", None) or 4096
        self.forward_logits = logits_forward(model)
        is_zebra = getattr(self.config, "model_type", None) == "zebra"
        if cache == "auto":
            cache = "static" if is_zebra and self.device.type == "cuda" else "dynamic"
        if cache not in ("static", "dynamic"):
            raise ValueError(f"cache must be 'auto', 'static' or 'dynamic', got {cache!r}")
        if cache == "static" and not is_zebra:
            raise ValueError(f"a static cache needs a zebra model, not {self.config.model_type!r}")
        self.cache_kind = cache
        self.cuda_graph = cache == "static" and cuda_graph and self.device.type == "cuda"
        runner = StaticRunner if cache == "static" else DecodeRunner
        # compiled code guards on the cache's host-side token count, so it is only worth it inside a graph
        self.compiled = compile and self.cuda_graph
        self.runner = runner(
            model,
            self.forward_logits,
            self.device,
            use_graph=self.cuda_graph,
            compile=self.compiled,
            capacity_limit=self.max_seq_len,
        )

    # ------------------------------------------------------------------ state
    def new_state(self, batch: int = 1, capacity: int | None = None) -> DecodeState:
        """An empty state for `batch` rows (a pre-allocated static cache when the runner uses one)."""
        return self.runner.new_state(batch, capacity or self.max_seq_len)

    def clone(self, state: DecodeState, n: int) -> DecodeState:
        """A new state whose rows are each row of `state` repeated `n` times (`[B] -> [B * n]`)."""
        return self.runner.clone(state, n)

    def cache_bytes(self, state: DecodeState) -> int:
        """Bytes the cache holds now (allocated bytes, for a static cache its full capacity)."""
        return self.runner.cache_bytes(state)

    def budgets(self, lengths: Sequence[int], max_new_tokens: int) -> list[int]:
        """New tokens each row may output after a sequence of `lengths[b]` tokens: `max_new_tokens`, but not
        past `context` (a row of 7 tokens and a context of 1024 gets at most 1017); a row already at or past the
        context gets `max_new_tokens` too, at most `context` of them (so its cache stays bounded)."""
        if self.context is None:
            return [max_new_tokens for _ in lengths]
        room = [self.context - n if n < self.context else self.context for n in lengths]
        return [min(max_new_tokens, r) for r in room]

    def capacity_for(self, lengths: Sequence[int], max_new_tokens: int) -> int:
        """Tokens a cache needs for rows of `lengths` tokens to output their `budgets` (the context at most,
        unless a row is longer already)."""
        budgets = self.budgets(lengths, max_new_tokens)
        return max(n + b for n, b in zip(lengths, budgets, strict=True))

    # ------------------------------------------------------------------ feeding
    @torch.inference_mode()
    def prefill(self, state: DecodeState, ids: torch.Tensor) -> torch.Tensor:
        """Feed `ids` `[B, T]` (T >= 1) to every row; returns the logits after the last one, `[B, V]` float32."""
        if ids.dim() != 2 or ids.shape[0] != state.batch:
            raise ValueError(f"prefill ids must be [B={state.batch}, T], got {tuple(ids.shape)}")
        if ids.shape[1] == 0:
            raise ValueError("prefill needs at least one token")
        state.check_room(ids.shape[1])
        if ids.shape[1] == 1:
            return self.step(state, ids[:, 0])
        # in chunks, so that attention's [chunk, length] scores stay bounded however long the prompt (a prompt
        # far past the context is fed whole, as docs/chat.md says, in bounded memory)
        chunk = max(PREFILL_MIN_CHUNK, PREFILL_PAIRS // (state.length + ids.shape[1]))
        for lo in range(0, ids.shape[1], chunk):
            part = ids[:, lo : lo + chunk]  # [B, chunk]
            logits = self.runner.prefill(state, part.to(self.device))
            state.length += part.shape[1]
        state.logits = logits
        return logits

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row, `tokens` `[B]`; returns the next logits `[B, V]` float32."""
        state.check_room(1)
        logits = self.runner.step(state, tokens.to(self.device))
        state.length += 1
        state.logits = logits
        return logits

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        stop_ids: set[int] | frozenset[int] = frozenset(),
        seed: int | None = None,
        num_samples: int = 1,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[list[int | None]]:
        """Stream new tokens for a batch of prompts, one column per step.

        Each yielded list has one entry per row (`len(prompts) * num_samples`, samples of a prompt adjacent):
        the row's new token, or None when the row already stopped. A row stops after yielding a token in
        `stop_ids` or its budget of tokens: `max_new_tokens`, but not past `context` (`budgets`); all rows stop
        when `should_stop()` turns true.

        With `num_samples > 1` the prompts are prefilled once and the cache is cloned per sample.
        """
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        lengths = [len(p) for p in prompts]
        shortest = min(lengths)
        state = self.new_state(batch=len(prompts), capacity=self.capacity_for(lengths, max_new_tokens))
        self.prefill(state, torch.tensor([list(p[:shortest]) for p in prompts], dtype=torch.long))
        if num_samples > 1:
            state = self.clone(state, num_samples)
        rows = [list(p) for p in prompts for _ in range(num_samples)]
        forced = [row[shortest:] for row in rows]  # prompt tokens still to feed, per row
        budgets = [b for b in self.budgets(lengths, max_new_tokens) for _ in range(num_samples)]
        yield from self._decode(state, forced, budgets, sampling, stop_ids, seed, should_stop)

    def generate_from(
        self,
        state: DecodeState,
        ids: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        stop_ids: set[int] | frozenset[int] = frozenset(),
        seed: int | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[list[int | None]]:
        """Continue a live batch-1 `state` (e.g. a chat): feed `ids`, then stream new tokens as `generate` does;
        the budget counts the whole sequence (`state.length + len(ids)`) against `context`, and a static state's
        capacity bounds it too (the reply stops where the cache is full instead of raising `CacheFullError`).

        Every yielded token is fed to the cache but the last one when the stream ended on a stop id or on
        `max_new_tokens` (after `should_stop()` it may be fed already): afterwards `state.unfed` is that token or
        None. The caller feeds it with its next `ids` if it wants it in the history (a chat drops a final
        end-of-turn token, its template adds one).
        """
        if state.batch != 1:
            raise ValueError("generate_from continues a batch-1 state")
        if ids:
            state.check_room(len(ids))
            self.prefill(state, torch.tensor([list(ids)], dtype=torch.long))
        elif state.logits is None:
            raise ValueError("nothing to continue from: feed at least one token")
        budget = self.budgets([state.length], max_new_tokens)[0]
        if state.capacity is not None:
            budget = min(budget, state.capacity - state.length)
        yield from self._decode(state, [[]], budget, sampling, stop_ids, seed, should_stop)

    @torch.inference_mode()
    def _decode(
        self,
        state: DecodeState,
        forced: list[list[int]],
        max_new_tokens: int | list[int],
        sampling: SamplingParams | None,
        stop_ids: set[int] | frozenset[int],
        seed: int | None,
        should_stop: Callable[[], bool] | None,
    ) -> Iterator[list[int | None]]:
        if seed is None:  # a fresh seed from torch's default generator (so torch.manual_seed still decides)
            seed = int(torch.empty((), dtype=torch.int64).random_(2**62).item())
        loop = DecodeLoop(
            self.runner,
            state,
            forced,
            max_new_tokens=max_new_tokens,
            sampling=sampling or SamplingParams(),
            stop_ids=stop_ids,
            seed=seed,
            should_stop=should_stop,
        )
        yield from loop


def generate_tokens(engine: Engine, prompts: Sequence[Sequence[int]], **kwargs: Any) -> list[list[int]]:
    """`Engine.generate` collected: the new tokens of every row (stop token included when one was hit)."""
    num_samples = kwargs.get("num_samples", 1)
    rows: list[list[int]] = [[] for _ in range(len(prompts) * num_samples)]
    for column in engine.generate(prompts, **kwargs):
        for b, token in enumerate(column):
            if token is not None:
                rows[b].append(token)
    return rows
