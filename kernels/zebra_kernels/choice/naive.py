"""The decode loop's bookkeeping after a token choice, in plain torch (about a dozen small kernels on a GPU): the
reference of the fused kernel and the CPU path."""

from __future__ import annotations

import torch


def torch_record_choice_(
    nxt: torch.Tensor,
    *,
    tokens: torch.Tensor,
    emitting: torch.Tensor,
    remaining: torch.Tensor,
    stopped: torch.Tensor,
    running: torch.Tensor,
    stop_ids: torch.Tensor,
) -> None:
    """Record the chosen tokens `nxt` `[B]` in the buffers, in place (see `record_choice_`)."""
    counted = emitting & ~stopped  # rows whose token is output now
    remaining.sub_(counted.long())
    hit = (nxt[:, None] == stop_ids[None, :]).any(dim=-1)  # [B]
    stopped.logical_or_(counted & (hit | (remaining <= 0)))
    tokens[:, 0].copy_(nxt)
    torch.logical_not(stopped.all(), out=running)
