"""How the engine runs the model: caches, prefill, the one-token step, cloning.

Two runners:
- `DecodeRunner` (dynamic): the model's own growing cache; works for any HF causal LM (ZebraForCausalLM, FLA,
  Llama). Every step is a normal eager forward.
- `StaticRunner`: a `ZebraCache` pre-allocated for `capacity` tokens and updated in place (states copied, latents
  written at the device-side offset, unused slots masked by position). On a GPU the one-token step is captured
  once per batch size in a CUDA graph (warm-up on a side stream, then `torch.cuda.graph`) and replayed after an
  in-place copy of the new tokens into the graph's input buffer, so a decode step costs one graph launch instead
  of hundreds of kernel launches from Python. Optionally the step is `torch.compile`d before capture.

A static runner owns one cache per batch size (the graph is bound to its buffers): a new state of batch B resets
and reuses that cache, so only one state per batch size is live at a time.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from zebra.generation.forward import LogitsForward
from zebra.generation.state import DecodeState
from zebra.models import ZebraCache


class DecodeRunner:
    """Eager decoding over the model's cache (see module docstring); `StaticRunner` adds the static/graph path.

    Args:
        model: the causal LM (eval mode, on `device`).
        forward: `logits_forward(model)`, the one model call.
        device: where the model and its cache live.
        use_graph: capture the one-token step in a CUDA graph (`StaticRunner` only).
        compile: `torch.compile` the step before its capture (`StaticRunner` only).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        forward: LogitsForward,
        device: torch.device,
        *,
        use_graph: bool,
        compile: bool,
    ):
        self.model = model
        self.forward = forward
        self.device = device
        self.use_graph = use_graph
        self.compile = compile

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
    """Static `ZebraCache` per batch size; the one-token step replayed from a CUDA graph when `use_graph`."""

    def __init__(
        self,
        model: torch.nn.Module,
        forward: LogitsForward,
        device: torch.device,
        *,
        use_graph: bool,
        compile: bool,
    ):
        super().__init__(model, forward, device, use_graph=use_graph, compile=compile)
        self._slots: dict[int, _StaticSlot] = {}
        self._pool = None
        self._step_fn = torch.compile(forward, dynamic=False) if compile else forward

    def new_state(self, batch: int, capacity: int) -> DecodeState:
        slot = self._slot(batch, capacity)
        slot.cache.reset()
        return DecodeState(cache=slot.cache, batch=batch, capacity=slot.cache.max_length)

    def _slot(self, batch: int, capacity: int) -> _StaticSlot:
        slot = self._slots.get(batch)
        if slot is None or slot.cache.max_length < capacity:
            capacity = max(capacity, slot.cache.max_length if slot else 0)
            self._slots.pop(batch, None)
            slot = _StaticSlot(self._new_cache(batch, capacity))
            if self.use_graph:
                self._capture(slot)
            self._slots[batch] = slot
        return slot

    def _new_cache(self, batch: int, capacity: int) -> ZebraCache:
        dtype = next(self.model.parameters()).dtype
        return ZebraCache(
            self.model.config, batch_size=batch, max_length=capacity, dtype=dtype, device=self.device
        )

    def prefill(self, state: DecodeState, ids: torch.Tensor) -> torch.Tensor:
        logits, _ = self.forward(ids, state.cache)
        return logits

    def step(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        slot = self._slots[state.batch]
        if slot.cache is not state.cache:
            raise RuntimeError("this decode state was replaced by a newer state of the same batch size")
        if slot.graph is None:
            logits, _ = self._step_fn(tokens[:, None], state.cache)
            return logits
        slot.tokens.copy_(tokens[:, None])
        slot.graph.replay()
        state.cache.seen_tokens += 1  # the graph advanced the device offset; keep the host count in step
        return slot.logits.clone()

    def clone(self, state: DecodeState, n: int) -> DecodeState:
        """Copy every row n times into the (reset) static cache for batch B * n (n == 1: the same state)."""
        if n == 1:
            return state
        target = self.new_state(state.batch * n, state.cache.max_length)
        src, dst = state.cache, target.cache
        if dst is src:
            return state
        if dst.max_length < src.max_length:
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
    def _capture(self, slot: _StaticSlot) -> None:
        """Warm up on a side stream, then record the one-token step into `slot.graph`."""
        cache = slot.cache
        slot.tokens = torch.zeros(cache.batch_size, 1, dtype=torch.long, device=self.device)
        # Capture with a non-empty cache so the model records its "continue from the state" branch.
        cache.reset()
        cache.seen_tokens = 1
        cache.offset_tensor.fill_(1)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step_fn(slot.tokens, cache)
                cache.seen_tokens = 1
                cache.offset_tensor.fill_(1)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            slot.logits, _ = self._step_fn(slot.tokens, cache)
        torch.cuda.synchronize()
        slot.graph = graph
        cache.reset()


class _StaticSlot:
    """One batch size's static cache, and its captured step (graph, input tokens `[B, 1]`, output logits `[B, V]`)."""

    def __init__(self, cache: Any):
        self.cache = cache
        self.graph: torch.cuda.CUDAGraph | None = None
        self.tokens: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None
