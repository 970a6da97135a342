"""Runs a torch-reference recurrence on equal-length or packed (`cu_seqlens`) sequences.

Packed inputs are unpacked into a zero-padded batch `[N, Tmax, ...]` (padding after each sequence is neutral
for every recurrence here), run as one batch, and packed back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zebra_kernels._common import pack, unpack


def run_varlen(
    step: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    sequences: list[torch.Tensor],
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`step(*sequences, initial_state=..., **kwargs) -> (out [B, T, ...], state)`, packing when needed."""
    if cu_seqlens is None:
        return step(*sequences, initial_state=initial_state, **kwargs)
    out, state = step(*(unpack(x, cu_seqlens) for x in sequences), initial_state=initial_state, **kwargs)
    return pack(out, cu_seqlens), state
