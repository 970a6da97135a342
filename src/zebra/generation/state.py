"""What a decode holds between calls: `DecodeState` (a cache and its fill) and the error for a full one.

Everything above this module (runners, engine, text streaming) shares these two types; this module imports none
of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class CacheFullError(ValueError):
    """A static cache has no room for the tokens to feed (its capacity is fixed when it is allocated)."""


@dataclass
class DecodeState:
    """A cache and what it holds.

    Attributes:
        cache: the model's cache object (layer states, conv states, MLA latents).
        batch: rows B.
        length: tokens fed so far (the same for every row).
        logits: `[B, V]` float32 logits after the last fed token (None before the first feed).
        capacity: tokens the cache can hold (static caches); None when it grows on demand.
    """

    cache: Any
    batch: int
    length: int = 0
    logits: torch.Tensor | None = None
    capacity: int | None = None

    def check_room(self, n: int) -> None:
        """Raise `CacheFullError` when `n` more tokens do not fit a fixed-capacity cache."""
        if self.capacity is not None and self.length + n > self.capacity:
            raise CacheFullError(
                f"the cache holds {self.capacity} tokens; {self.length} used, {n} more requested "
                f"(pass a larger max_seq_len / capacity)"
            )
