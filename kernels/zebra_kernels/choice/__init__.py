"""The decode loop's bookkeeping after each token choice, fused: `record_choice_`.

`zebra.generation.token_sampling.TokenChooser` keeps its decode's state in device buffers (so a step and its
choice replay from CUDA graphs without a host read); after drawing the tokens it updates them. In torch that is
about a dozen one-element launches per step (`torch_record_choice_`); on a GPU it is one Triton launch
(`zebra_kernels.choice.triton_fused`).
"""

from __future__ import annotations

import torch

from zebra_kernels.choice.naive import torch_record_choice_

__all__ = ["record_choice_", "torch_record_choice_"]


def record_choice_(
    nxt: torch.Tensor,
    *,
    tokens: torch.Tensor,
    emitting: torch.Tensor,
    remaining: torch.Tensor,
    stopped: torch.Tensor,
    running: torch.Tensor,
    stop_ids: torch.Tensor,
    fused: bool | None = None,
) -> None:
    """Record the chosen tokens `nxt` `[B]` (int64) in the chooser's buffers, in place.

    Args:
        tokens: `[B, 1]` int64: gets `nxt` (the next step's input).
        emitting: `[B]` bool: rows whose token this step is output.
        remaining: `[B]` int64: tokens each row may still output; an emitting, running row counts one down.
        stopped: `[B]` bool: set where an emitting, running row chose a stop id or used its last token.
        running: `[]` bool: set to whether any row is not stopped.
        stop_ids: `[S]` int64, padded with -1.
        fused: the Triton kernel (True), the torch form (False), or None: the kernel on a GPU.
    """
    buffers = dict(
        tokens=tokens,
        emitting=emitting,
        remaining=remaining,
        stopped=stopped,
        running=running,
        stop_ids=stop_ids,
    )
    if fused is None:
        fused = nxt.device.type == "cuda"
    if fused:
        from zebra_kernels.choice.triton_fused import supported, triton_record_choice_

        if supported(nxt, tokens, stop_ids):
            triton_record_choice_(nxt, **buffers)
            return
    torch_record_choice_(nxt, **buffers)
