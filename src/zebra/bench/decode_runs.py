"""The timed engine runs that every decode figure shares: a prefill into a fresh cache, then one-token steps fed
on the device (each the argmax of the last logits), synchronised once at the end."""

from __future__ import annotations

import time
from typing import Any

import torch


def engine_runs(engine: Any, prompts: torch.Tensor, n_new: int, capacity: int) -> tuple[float, float, Any]:
    """(prefill seconds, seconds of `n_new` steps fed on the device, the state): the prefill into a fresh cache
    for `capacity` tokens, then steps each fed the argmax of the last logits, synchronised once at the end."""
    device = engine.device
    state = engine.new_state(prompts.shape[0], capacity=capacity)
    ids = prompts.to(device)
    sync(device)
    t0 = time.perf_counter()
    engine.prefill(state, ids)
    sync(device)
    t1 = time.perf_counter()
    tokens = state.logits.argmax(-1)
    for _ in range(n_new):
        tokens = engine.step(state, tokens).argmax(-1)
    sync(device)
    return t1 - t0, time.perf_counter() - t1, state


def step_ms(engine: Any, prompts: torch.Tensor, n_new: int, capacity: int) -> float:
    """Milliseconds per step after `prompts` (a warm-up run of 8 steps first: kernels, graph capture)."""
    with torch.inference_mode():
        engine_runs(engine, prompts, min(n_new, 8), capacity)
        _, seconds, _ = engine_runs(engine, prompts, n_new, capacity)
    return seconds / n_new * 1e3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
