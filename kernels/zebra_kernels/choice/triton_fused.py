"""`record_choice_` as one Triton launch (GPU; also under `TRITON_INTERPRET=1` on a CPU, as the tests run it).

One program holds every row (a decode batch is small: B and the stop slots are padded to powers of two): it
counts the rows that output a token, takes their budgets down, marks the rows that hit a stop id or their last
token, writes the chosen tokens into the next step's input and whether any row still runs. The torch form is
about a dozen launches per decode step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zebra_kernels._common import on_device


@triton.jit
def _record_choice_kernel(
    nxt_ptr,  # [B] int64, the chosen tokens
    tokens_ptr,  # [B, 1] int64 (row stride stride_tokens)
    emitting_ptr,  # [B] bool
    remaining_ptr,  # [B] int64
    stopped_ptr,  # [B] bool
    running_ptr,  # [] bool
    stop_ptr,  # [S] int64, padded with -1
    B,
    S,
    stride_tokens,
    BLOCK_B: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_B)
    ok = rows < B
    nxt = tl.load(nxt_ptr + rows, mask=ok, other=-1)  # [BLOCK_B]
    emitting = tl.load(emitting_ptr + rows, mask=ok, other=0) != 0
    stopped = tl.load(stopped_ptr + rows, mask=ok, other=1) != 0
    remaining = tl.load(remaining_ptr + rows, mask=ok, other=0)
    slots = tl.arange(0, BLOCK_S)
    ids = tl.load(stop_ptr + slots, mask=slots < S, other=-1)  # [BLOCK_S]
    counted = emitting & (stopped == 0)
    remaining = remaining - counted.to(remaining.dtype)
    hit = tl.max(((nxt[:, None] == ids[None, :]) & (ids[None, :] >= 0)).to(tl.int32), axis=1) > 0
    stopped = stopped | (counted & (hit | (remaining <= 0)))
    tl.store(remaining_ptr + rows, remaining, mask=ok)
    tl.store(stopped_ptr + rows, stopped, mask=ok)
    tl.store(tokens_ptr + rows * stride_tokens, nxt, mask=ok)
    live = tl.sum((ok & (stopped == 0)).to(tl.int32), axis=0)
    tl.store(
        running_ptr + rows * 0, live > 0, mask=rows == 0
    )  # a block store: the interpreter takes no scalar


def triton_record_choice_(nxt, *, tokens, emitting, remaining, stopped, running, stop_ids) -> None:
    """`torch_record_choice_` (same arguments) in one launch."""
    B, S = nxt.shape[0], stop_ids.shape[0]
    with on_device(nxt):
        _record_choice_kernel[(1,)](
            nxt, tokens, emitting, remaining, stopped, running, stop_ids, B, S, tokens.stride(0),
            BLOCK_B=triton.next_power_of_2(B), BLOCK_S=triton.next_power_of_2(S), num_warps=1,
        )  # fmt: skip


def supported(nxt: torch.Tensor, tokens: torch.Tensor, stop_ids: torch.Tensor) -> bool:
    """The layouts the kernel reads: contiguous `[B]` buffers and tokens `[B, 1]` (any row stride), B <= 4096."""
    return nxt.is_contiguous() and stop_ids.is_contiguous() and tokens.dim() == 2 and nxt.shape[0] <= 4096
