"""`ZebraCache`: the decode state of a Zebra model, one slot per sublayer, of the kind its mixer's
`zebra.mixers.MixerSpec.state` names:

- "recurrent" (`M`, `G`, `K`): the recurrent state (float32) and the short-convolution state (the last W raw conv
  inputs, `[B, C, W]`, in the model dtype in a static cache: the inputs are model-dtype values, so nothing is lost
  and a decode step needs no cast; None for a mixer without a convolution);
- "latent" (MLA, `*`): per token the normalised key/value latent `[B, L, kv_lora_rank]` and the roped shared
  key `[B, L, qk_rope_head_dim]` (model dtype); never expanded keys/values;
- None (MLP, `-`): nothing.

Two forms:
- dynamic (default): states appear on the first forward; latents grow by concatenation.
- static (`ZebraCache(config, batch_size=B, max_length=L, dtype=..., device=...)`): every tensor is allocated up
  front and updated in place, and the write position is a device tensor (`offset_tensor`), so a CUDA-graph decode
  engine can capture `model(..., cache=cache)` once and replay it. Unused latent slots are masked by position.
  `feed`, a 0-d bool device tensor (True unless set), says whether a forward's tokens enter the cache: with False
  the states and the offset stay as they were (the latents written at the offset are overwritten by the next
  fed token), so an engine may launch a step before it knows whether the sequence has ended.

`offset` is the number of tokens already in the cache when a forward starts; `ZebraModel.forward` calls
`advance(T)` once after all sublayers ran. The cache subclasses `transformers.Cache`, so `generate()` (greedy,
sampling, beam search via `reorder_cache`, `num_return_sequences` via `batch_repeat_interleave`) works with it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers.cache_utils import Cache

from zebra.mixers import mixer_spec


class RecurrentState:
    """State of one recurrent sublayer: `recurrent` `[B, H, K, V]` (per mixer kind) and `conv` `[B, C, W]`."""

    def __init__(self, recurrent: torch.Tensor | None = None, conv: torch.Tensor | None = None):
        self.recurrent = recurrent
        self.conv = conv

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"recurrent": self.recurrent, "conv": self.conv}


class LatentState:
    """State of one MLA sublayer: `latent` `[B, L, Rkv]` and `k_rope` `[B, L, dr]`."""

    def __init__(self, latent: torch.Tensor | None = None, k_rope: torch.Tensor | None = None):
        self.latent = latent
        self.k_rope = k_rope

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"latent": self.latent, "k_rope": self.k_rope}


SLOT_TYPES = {"recurrent": RecurrentState, "latent": LatentState}  # MixerSpec.state -> the slot's class


class ZebraCache(Cache):
    """Hybrid decode cache for `ZebraForCausalLM` (see the module docstring).

    Args:
        config: the model's `ZebraConfig` (its `layer_pattern` decides each slot's kind, `zebra.mixers`).
        batch_size: with `max_length`, pre-allocate a static cache for this many sequences.
        max_length: static capacity in tokens (prompt + generated).
        dtype: the model's dtype: a static cache keeps MLA latents and conv states in it; recurrent states are
            float32 (float64 for a float64 model).
        device: device of a static cache.
    """

    is_compileable = False  # generate() must not build 4-D masks for us: MLA masks by position itself

    def __init__(
        self,
        config: Any,
        batch_size: int | None = None,
        max_length: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        self.pattern = config.layer_pattern
        specs = [mixer_spec(char) for char in self.pattern]
        super().__init__(layers=[SLOT_TYPES[s.state]() if s.state else None for s in specs])
        self.static = max_length is not None
        self.max_length = max_length
        self.seen_tokens = 0
        self.offset_tensor: torch.Tensor | None = None
        self.feed: torch.Tensor | None = None
        if self.static:
            if batch_size is None or batch_size < 1 or max_length < 1:
                raise ValueError(
                    f"a static ZebraCache needs batch_size >= 1 and max_length >= 1, got {batch_size}, {max_length}"
                )
            state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
            for spec, layer in zip(specs, self.layers, strict=True):
                for name, shape in spec.state_shapes(config, batch_size, max_length).items():
                    t_dtype = state_dtype if name == "recurrent" else dtype
                    setattr(layer, name, torch.zeros(shape, dtype=t_dtype, device=device))
            self.offset_tensor = torch.zeros((), dtype=torch.long, device=device)
            self.feed = torch.ones((), dtype=torch.bool, device=device)

    # ------------------------------------------------------------------ used by the mixers
    @property
    def offset(self) -> int | torch.Tensor:
        """Tokens already cached before the current forward: an int, or a 0-d device tensor in a static cache."""
        return self.offset_tensor if self.static else self.seen_tokens

    def positions(self, T: int, device: torch.device) -> torch.Tensor:
        """Default RoPE positions `[1, T]` of the next T tokens."""
        return (self.offset + torch.arange(T, device=device))[None]

    def recurrent_state(self, layer_idx: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(recurrent state, conv state) of a recurrent sublayer; None before its first update (dynamic)."""
        layer = self.layers[layer_idx]
        return layer.recurrent, layer.conv

    def update_recurrent(self, layer_idx: int, recurrent: torch.Tensor, conv: torch.Tensor | None) -> None:
        """Store the new states (in place in a static cache, where `feed` False keeps the old ones); `conv` is None
        for a mixer without a convolution. A state that is the cache's own buffer was written by its kernel."""
        layer = self.layers[layer_idx]
        if self.static:
            for old, new in ((layer.recurrent, recurrent), (layer.conv, conv)):
                if new is not None and new is not old:
                    torch.where(self.feed, new.to(old.dtype), old, out=old)
        else:
            layer.recurrent, layer.conv = recurrent, conv

    def update_latents(
        self, layer_idx: int, latent: torch.Tensor, k_rope: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append T new tokens' latents `[B, T, Rkv]` and keys `[B, T, dr]`; return all slots `[B, L, ...]`.

        Dynamic: L = offset + T. Static: L = max_length; slots past offset + T hold zeros or stale values and
        are excluded by the causal mask (key slot <= query slot)."""
        layer = self.layers[layer_idx]
        if not self.static:
            if layer.latent is not None:
                latent = torch.cat([layer.latent, latent], dim=1)
                k_rope = torch.cat([layer.k_rope, k_rope], dim=1)
            layer.latent, layer.k_rope = latent, k_rope
            return latent, k_rope
        T = latent.shape[1]
        if self.seen_tokens + T > self.max_length:
            raise ValueError(
                f"static ZebraCache is full: {self.seen_tokens} cached + {T} new tokens > max_length={self.max_length}"
            )
        slots = self.offset_tensor + torch.arange(T, device=latent.device)  # [T]
        layer.latent.index_copy_(1, slots, latent.to(layer.latent.dtype))
        layer.k_rope.index_copy_(1, slots, k_rope.to(layer.k_rope.dtype))
        return layer.latent, layer.k_rope

    def advance(self, T: int) -> None:
        """Count T more cached tokens (called once per model forward, after every sublayer; in a static cache the
        device offset moves only when `feed` is True, and `uncount` corrects the host count afterwards)."""
        self.seen_tokens += T
        if self.static:
            self.offset_tensor.add_(self.feed, alpha=T)

    def uncount(self, T: int) -> None:
        """Take back the host count of a forward that ran with `feed` False (its tokens did not enter the cache)."""
        self.seen_tokens -= T

    # ------------------------------------------------------------------ batch manipulation
    def _map(self, fn, *, in_place: bool) -> None:
        for layer in self.layers:
            if layer is None:
                continue
            for name, t in layer.tensors().items():
                if t is None:
                    continue
                new = fn(t)
                if in_place and new.shape == t.shape:
                    t.copy_(new)
                else:
                    setattr(layer, name, new)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i becomes row `beam_idx[i]` (in place for a static cache)."""
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)), in_place=self.static)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices.to(t.device)], in_place=False)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each row `repeats` times (one prompt, several samples)."""
        self._map(lambda t: t.repeat_interleave(repeats, dim=0), in_place=False)

    def clone(self) -> ZebraCache:
        """An independent copy with cloned tensors (e.g. one per sample after a shared prefill)."""
        new = copy.copy(self)
        new.layers = [
            None
            if layer is None
            else type(layer)(**{k: None if t is None else t.clone() for k, t in layer.tensors().items()})
            for layer in self.layers
        ]
        if self.offset_tensor is not None:
            new.offset_tensor = self.offset_tensor.clone()
            new.feed = self.feed.clone()
        return new

    def reset(self) -> None:
        """Forget everything (a static cache is zeroed in place and keeps its buffers)."""
        if self.static:
            self._map(torch.zeros_like, in_place=True)
            self.offset_tensor.zero_()
            self.feed.fill_(True)
        else:
            for i, layer in enumerate(self.layers):
                if layer is not None:
                    self.layers[i] = type(layer)()
        self.seen_tokens = 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("ZebraCache cannot roll back: recurrent states keep no history")

    # ------------------------------------------------------------------ transformers.Cache interface
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_length if self.static else -1

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.seen_tokens + query_length, 0

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return self.seen_tokens > 0

    def early_initialization(self, *args, **kwargs) -> None:
        """Nothing to do: a static cache is allocated in `__init__`, a dynamic one on first use."""

    @property
    def batch_size(self) -> int:
        for layer in self.layers:
            for t in layer.tensors().values() if layer is not None else ():
                if t is not None:
                    return t.shape[0]
        return -1

    @property
    def is_initialized(self) -> bool:
        return self.static or self.seen_tokens > 0

    @property
    def is_croppable(self) -> bool:
        return False

    def __repr__(self) -> str:
        form = f"static, max_length={self.max_length}" if self.static else "dynamic"
        return f"ZebraCache(pattern={self.pattern!r}, {form}, seen_tokens={self.seen_tokens})"
