"""How the engine runs the model: caches, prefill, the one-token step, token choice, cloning.

Two runners:
- `DecodeRunner` (dynamic): the model's own growing cache; works for any HF causal LM (ZebraForCausalLM, FLA,
  Llama). Every step is a normal eager forward, and tokens are chosen eagerly on the model's device.
- `StaticRunner`: a `ZebraCache` pre-allocated for `capacity` tokens and updated in place (states copied, latents
  written at the device-side offset, unused slots masked by position). On a GPU the one-token step is captured
  once per slot in a CUDA graph (warm-up on a side stream, then `torch.cuda.graph`) and replayed after an in-place
  copy of the new tokens into the graph's input buffer, so a decode step costs one graph launch instead of
  hundreds of kernel launches from Python. Token choice (`TokenChooser.choose`) is captured too, once per sampling
  kind, writing its tokens straight into the step graph's input. Optionally the step is `torch.compile`d before
  capture. The cache's `feed` flag lets the engine launch a step before it has read the previous token.

A static runner owns one slot (cache, graphs, chooser) per batch size: a new state of batch B resets and reuses
that cache when it is large enough, so only one state per batch size is live at a time. A slot is sized by
`bucket_capacity` (powers of two up to the engine's `max_seq_len`), so requests of similar lengths share one slot;
when a request needs more, the old slot's graphs and cache are released before the new ones are allocated and
captured. Every graph has its own memory pool: a pool is never shared with a graph that may be released first.
A model without MLA sublayers (GDN / KDA / Mamba2 only) has a cache of the same size whatever the length: its
slot is never regrown and its states have no capacity (`DecodeState.capacity` None), so decoding never ends for
lack of room.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from typing import Any

import torch

from zebra.generation.forward import LogitsForward
from zebra.generation.state import DecodeState
from zebra.generation.token_sampling import SamplingParams, TokenChooser
from zebra.mixers import keeps_tokens
from zebra.models import ZebraCache

WARMUP_STEPS = 3  # eager runs on a side stream before a capture: kernel selection, autotuning, allocator


def bucket_capacity(tokens: int, limit: int) -> int:
    """The capacity a static slot gets for a request of `tokens`: the next power of two, but not past `limit`
    (the engine's `max_seq_len`) unless the request itself is longer."""
    bucket = 1 << max(tokens - 1, 0).bit_length()
    return max(tokens, min(bucket, limit))


def stop_slots(n: int) -> int:
    """Stop-id slots of a chooser for `n` stop ids: a power of two, at least 8 (one captured chooser serves them)."""
    return max(8, 1 << max(n - 1, 0).bit_length())


class DecodeRunner:
    """Eager decoding over the model's cache (see module docstring); `StaticRunner` adds the static/graph path.

    Args:
        model: the causal LM (eval mode, on `device`).
        forward: `logits_forward(model)`, the one model call.
        device: where the model and its cache live.
        use_graph: capture the one-token step in a CUDA graph (`StaticRunner` only).
        compile: `torch.compile` the step before its capture (`StaticRunner` only).
        capacity_limit: the largest bucket a static slot is rounded up to (`StaticRunner` only).
    """

    lagged = False  # the cache has no feed flag: the engine reads each token before the next step

    def __init__(
        self,
        model: torch.nn.Module,
        forward: LogitsForward,
        device: torch.device,
        *,
        use_graph: bool,
        compile: bool,
        capacity_limit: int,
    ):
        self.model = model
        self.forward = forward
        self.device = device
        self.use_graph = use_graph
        self.compile = compile
        self.capacity_limit = capacity_limit

    def new_state(self, batch: int, capacity: int) -> DecodeState:
        return DecodeState(cache=None, batch=batch)

    def prefill(self, state: DecodeState, ids: torch.Tensor) -> torch.Tensor:
        logits, state.cache = self.forward(ids, state.cache)
        return logits

    def step(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        logits, state.cache = self.forward(tokens[:, None], state.cache)
        return logits

    def clone(self, state: DecodeState, n: int) -> DecodeState:
        cache = copy.deepcopy(state.cache)
        if n > 1:
            cache.batch_repeat_interleave(n)
        logits = None if state.logits is None else state.logits.repeat_interleave(n, dim=0)
        return DecodeState(cache=cache, batch=state.batch * n, length=state.length, logits=logits)

    def cache_bytes(self, state: DecodeState) -> int:
        """Bytes of the cache's layer tensors (HF caches and ZebraCache keep them in `.layers`)."""
        return tensor_bytes(getattr(state.cache, "layers", state.cache))

    # ---------------------------------------------------------------- token choice on the device
    def chooser(
        self,
        state: DecodeState,
        sampling: SamplingParams,
        stop_ids: Collection[int],
        max_new_tokens: int | Sequence[int],
        seed: int,
    ) -> TokenChooser:
        """The chooser for one decode call on `state`, started: buffers set for these settings, its random
        stream (a generator on the device) seeded with `seed`."""
        vocab = state.logits.shape[-1]
        chooser = TokenChooser(state.batch, vocab, self.device, stop_slots=stop_slots(len(stop_ids)))
        generator = torch.Generator(device=self.device).manual_seed(seed)
        chooser.start(sampling, stop_ids, max_new_tokens, generator)
        return chooser

    def choose(self, state: DecodeState, chooser: TokenChooser) -> None:
        """Choose the next tokens from `state.logits` into `chooser.tokens` (on the device)."""
        chooser.choose(state.logits)

    def feed(self, state: DecodeState, chooser: TokenChooser) -> None:
        """Run one step on `chooser.tokens`; sets `state.logits`."""
        state.logits, state.cache = self.forward(chooser.tokens, state.cache)

    def retract(self, state: DecodeState) -> None:
        """The last `feed` ran with every row stopped, so the cache did not take its tokens (lagged runners)."""
        raise RuntimeError("a runner without a feed flag never steps past a stop")

    def finish(self, state: DecodeState, chooser: TokenChooser) -> None:
        """A decode call is over: leave `state` ready for the next feed."""


def tensor_bytes(obj: Any, _seen: set[int] | None = None) -> int:
    """Bytes of every distinct tensor reachable from `obj` (lists, tuples, dicts and object attributes)."""
    seen = _seen if _seen is not None else set()
    if obj is None or id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


class StaticRunner(DecodeRunner):
    """Static `ZebraCache` per batch size; the step and token choice replayed from CUDA graphs when `use_graph`."""

    lagged = True  # the static cache's feed flag makes a step after the last token a no-op

    def __init__(self, model, forward, device, *, use_graph: bool, compile: bool, capacity_limit: int):
        super().__init__(
            model, forward, device, use_graph=use_graph, compile=compile, capacity_limit=capacity_limit
        )
        self._slots: dict[int, _StaticSlot] = {}
        self._step_fn = torch.compile(forward, dynamic=False) if compile else forward
        # whether the cache holds something per token (MLA latents); without, its size ignores the capacity
        self.grows = keeps_tokens(model.config.layer_pattern)

    def new_state(self, batch: int, capacity: int) -> DecodeState:
        slot = self._slot(batch, capacity)
        slot.cache.reset()
        room = slot.cache.max_length if self.grows else None
        return DecodeState(cache=slot.cache, batch=batch, capacity=room)

    def _slot(self, batch: int, capacity: int) -> _StaticSlot:
        slot = self._slots.get(batch)
        if slot is not None and (slot.cache.max_length >= capacity or not self.grows):
            return slot
        if slot is not None:  # release the old graphs and cache before the new ones take memory
            del self._slots[batch]
            slot.release()
        slot = _StaticSlot(self._new_cache(batch, bucket_capacity(capacity, self.capacity_limit)))
        self._slots[batch] = slot
        if self.use_graph:
            self._capture_step(slot)
        return slot

    def _new_cache(self, batch: int, capacity: int) -> ZebraCache:
        dtype = next(self.model.parameters()).dtype
        return ZebraCache(
            self.model.config, batch_size=batch, max_length=capacity, dtype=dtype, device=self.device
        )

    def _live_slot(self, state: DecodeState) -> _StaticSlot:
        slot = self._slots.get(state.batch)
        if slot is None or slot.cache is not state.cache:
            raise RuntimeError("this decode state was replaced by a newer state of the same batch size")
        return slot

    def prefill(self, state: DecodeState, ids: torch.Tensor) -> torch.Tensor:
        logits, _ = self.forward(ids, state.cache)
        return logits

    def step(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        slot = self._live_slot(state)
        if slot.graph is None:
            logits, _ = self._step_fn(tokens[:, None], state.cache)
            return logits
        slot.tokens.copy_(tokens[:, None])
        slot.graph.replay()
        state.cache.seen_tokens += 1  # the graph advanced the device offset; keep the host count in step
        return slot.logits.clone()

    def chooser(self, state, sampling, stop_ids, max_new_tokens, seed) -> TokenChooser:
        """The slot's chooser (its buffers bound to the captured graphs), started; captured for this sampling
        kind on first use. The slot keeps one generator: a captured graph draws from the one it was recorded
        with."""
        slot = self._live_slot(state)
        slots = stop_slots(len(stop_ids))
        if slot.chooser is None or slot.chooser.stop_ids.numel() < slots:
            vocab = self.model.config.vocab_size
            slot.release_choosers()
            slot.chooser = TokenChooser(
                state.batch, vocab, self.device, stop_slots=slots, running=state.cache.feed
            )
            if slot.graph is not None:  # the chosen tokens are the step graph's input
                slot.chooser.tokens = slot.tokens
        chooser = slot.chooser
        chooser.start(sampling, stop_ids, max_new_tokens, slot.generator)
        if slot.graph is not None and sampling.kind not in slot.choice_graphs:
            self._capture_choice(slot)
            chooser.start(sampling, stop_ids, max_new_tokens, slot.generator)  # undo the warm-up's changes
        slot.generator.manual_seed(seed)
        return chooser

    def choose(self, state: DecodeState, chooser: TokenChooser) -> None:
        slot = self._live_slot(state)
        graph = slot.choice_graphs.get(chooser.kind)
        if graph is None:
            chooser.choose(state.logits)
            return
        if state.logits is not slot.logits:  # logits from a prefill: where the captured chooser reads them
            slot.logits.copy_(state.logits)
        graph.replay()

    def feed(self, state: DecodeState, chooser: TokenChooser) -> None:
        slot = self._live_slot(state)
        if slot.graph is None:
            state.logits, _ = self._step_fn(chooser.tokens, state.cache)
            return
        slot.graph.replay()
        state.cache.seen_tokens += 1
        state.logits = slot.logits  # valid until the next replay; `finish` keeps a copy

    def retract(self, state: DecodeState) -> None:
        state.cache.uncount(1)

    def finish(self, state: DecodeState, chooser: TokenChooser) -> None:
        state.cache.feed.fill_(True)  # after any step already queued: the next tokens enter the cache again
        slot = self._slots.get(state.batch)
        if slot is not None and slot.logits is not None and state.logits is slot.logits:
            state.logits = slot.logits.clone()

    def clone(self, state: DecodeState, n: int) -> DecodeState:
        """Copy every row n times into the (reset) static cache for batch B * n (n == 1: the same state)."""
        if n == 1:
            return state
        target = self.new_state(state.batch * n, state.cache.max_length)
        src, dst = state.cache, target.cache
        if dst is src:
            return state
        if self.grows and dst.max_length < src.max_length:
            raise ValueError("clone target cache is smaller than the source")
        for s_layer, d_layer in zip(src.layers, dst.layers, strict=True):
            if s_layer is None:
                continue
            for name, t in s_layer.tensors().items():
                d = getattr(d_layer, name)
                if name in ("latent", "k_rope"):
                    d[:, : t.shape[1]].copy_(t.repeat_interleave(n, dim=0))
                else:
                    d.copy_(t.repeat_interleave(n, dim=0))
        dst.offset_tensor.copy_(src.offset_tensor)
        dst.seen_tokens = src.seen_tokens
        target.length = state.length
        target.logits = None if state.logits is None else state.logits.repeat_interleave(n, dim=0)
        return target

    @torch.inference_mode()
    def _capture_step(self, slot: _StaticSlot) -> None:
        """Warm up on a side stream, then record the one-token step into `slot.graph` (its own memory pool)."""
        cache = slot.cache
        slot.tokens = torch.zeros(cache.batch_size, 1, dtype=torch.long, device=self.device)

        def one_step():
            return self._step_fn(slot.tokens, cache)

        def rewind():  # capture with a non-empty cache so the model records its "continue from the state" branch
            cache.seen_tokens = 1
            cache.offset_tensor.fill_(1)

        cache.reset()
        rewind()
        graph, (slot.logits, _) = _capture(one_step, after_warmup=rewind)
        slot.graph = graph
        cache.reset()

    @torch.inference_mode()
    def _capture_choice(self, slot: _StaticSlot) -> None:
        """Record `slot.chooser.choose(slot.logits)` for the chooser's sampling kind (its own memory pool);
        the warm-up and capture change the chooser's buffers, which the caller starts again."""
        chooser = slot.chooser
        generator = None if chooser.kind == "greedy" else chooser.generator  # greedy draws no random numbers
        graph, _ = _capture(lambda: chooser.choose(slot.logits), generator=generator)
        slot.choice_graphs[chooser.kind] = graph


def _capture(fn, *, after_warmup=None, generator: torch.Generator | None = None):
    """Run `fn` WARMUP_STEPS times on a side stream, then record it into a new CUDA graph with its own memory
    pool (registering `generator`, so each replay draws fresh random numbers from it). Returns (graph, output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            fn()
            if after_warmup is not None:
                after_warmup()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


class _StaticSlot:
    """One batch size's static cache and what is bound to its buffers: the captured step (graph, input tokens
    `[B, 1]`, output logits `[B, V]`), the chooser and its captured graphs (one per sampling kind)."""

    def __init__(self, cache: ZebraCache):
        self.cache = cache
        self.generator = torch.Generator(device=cache.offset_tensor.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.tokens: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None
        self.chooser: TokenChooser | None = None
        self.choice_graphs: dict[str, torch.cuda.CUDAGraph] = {}

    def release_choosers(self) -> None:
        """Drop the chooser graphs (and their pools) before the chooser's buffers go."""
        for graph in self.choice_graphs.values():
            graph.reset()
        self.choice_graphs = {}

    def release(self) -> None:
        """Free the graphs, their memory pools and the cache now, before a replacement is allocated."""
        if self.graph is not None:
            torch.cuda.synchronize()  # no replay of these graphs may still be running
        self.release_choosers()
        if self.graph is not None:
            self.graph.reset()
        self.graph = self.tokens = self.logits = self.chooser = None
        self.cache = None
