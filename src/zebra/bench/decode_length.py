"""Whether MLA decode costs follow the real length (issue 41 item 2): the engine's step at C cached tokens in a
cache of a large capacity against a cache sized to the prompt (C + new tokens), in one process.

Each length gets a random prompt of C tokens; both caches are static (`Engine(cache="static")`, CUDA graphs on a
GPU) and timed as the decode bench's engine step (`decode_runs.step_ms`: steps fed on the device, one
synchronisation). `ratio` = large-capacity ms / sized ms: 1.0 when attention reads only the cached tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from zebra.bench.decode_runs import step_ms
from zebra.generation import Engine


@dataclass
class LengthRow:
    cached: int  # prompt tokens in the cache when the steps start
    capacity: int  # the large cache's capacity
    capacity_ms_per_token: float
    sized_capacity: int  # cached + new tokens
    sized_ms_per_token: float
    ratio: float  # capacity ms / sized ms


def length_rows(
    model: torch.nn.Module,
    lengths: list[int],
    capacity: int,
    new: int,
    *,
    cuda_graph: bool,
    compile: bool,
    seed: int = 0,
    say: Any = None,
) -> list[LengthRow]:
    """One `LengthRow` per cached length (batch 1): the step in a `capacity`-token cache, then in one of
    `length + new` tokens."""
    gen = torch.Generator().manual_seed(seed)
    big = Engine(model, cache="static", cuda_graph=cuda_graph, compile=compile, max_seq_len=capacity)
    rows = []
    for cached in lengths:
        prompt = torch.randint(0, model.config.vocab_size, (1, cached), generator=gen)
        if say is not None:
            say(f"{cached} cached tokens: {capacity}-token cache, then {cached + new}")
        big_ms = step_ms(big, prompt, new, capacity)
        sized = Engine(
            model, cache="static", cuda_graph=cuda_graph, compile=compile, max_seq_len=cached + new
        )
        sized_ms = step_ms(sized, prompt, new, cached + new)
        del sized  # its graphs and cache go before the next length's
        rows.append(LengthRow(cached, capacity, big_ms, cached + new, sized_ms, big_ms / sized_ms))
    return rows
