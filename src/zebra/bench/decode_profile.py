"""The per-kernel breakdown of one decode step (issue 41 item 1's profile): `torch.profiler` around the engine's
steps as the decode bench times them (graph replay included), each kernel's calls and time per step.

On a GPU the rows are the device kernels (CUDA graph replays are traced kernel by kernel by CUPTI; when a replay
shows none, the step is profiled again without the graph and `mode` says so); on a CPU they are the torch ops'
self times (`source` says which), so the same code runs anywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from zebra.bench.decode_runs import sync

PROFILED_STEPS = 16
WARMUP_STEPS = 4


@dataclass
class KernelRow:
    name: str
    calls_per_step: float
    us_per_step: float
    share: float  # of the kernels' time per step


@dataclass
class DecodeProfile:
    batch: int
    steps: int
    mode: str  # "cuda graph" or "eager"
    source: str  # "device kernels" or "cpu ops"
    step_ms: float  # wall time per step while profiled (the profiler adds a little)
    kernel_us_per_step: float  # summed kernel time per step
    kernels_per_step: float
    roofline_ms: float | None = None  # the decode bench's, same batch
    rows: list[KernelRow] = field(default_factory=list)


def profile_step(engine: Any, prompts: torch.Tensor, new: int, *, top: int = 40) -> DecodeProfile:
    """Prefill `prompts` into a cache of `prompt + new` tokens (room for the profiled steps at least), warm up,
    then profile `PROFILED_STEPS` steps."""
    device = engine.device
    with (
        torch.inference_mode()
    ):  # the state too: the timed runs made the graphed slot it reuses in inference mode
        state = engine.new_state(
            prompts.shape[0], capacity=prompts.shape[1] + max(new, WARMUP_STEPS + PROFILED_STEPS)
        )
        engine.prefill(state, prompts.to(device))
        tokens = state.logits.argmax(-1)
        for _ in range(WARMUP_STEPS):
            tokens = engine.step(state, tokens).argmax(-1)
        sync(device)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            t0 = time.perf_counter()
            for _ in range(PROFILED_STEPS):
                tokens = engine.step(state, tokens).argmax(-1)
            sync(device)
            seconds = time.perf_counter() - t0
    mode = "cuda graph" if getattr(engine, "cuda_graph", False) else "eager"
    source, totals = kernel_totals(prof, device)
    return summarise(totals, prompts.shape[0], mode, source, seconds, top)


def kernel_totals(prof: Any, device: torch.device) -> tuple[str, dict[str, tuple[int, float]]]:
    """(source, {name: (calls, microseconds)}) over the profiled region: device kernels on a GPU, else the ops'
    self CPU time."""
    totals: dict[str, tuple[int, float]] = {}
    if device.type == "cuda":
        for event in prof.events():
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            calls, us = totals.get(event.name, (0, 0.0))
            totals[event.name] = (calls + 1, us + event.time_range.elapsed_us())
        return "device kernels", totals
    for avg in prof.key_averages():
        if avg.self_cpu_time_total > 0 and not avg.key.startswith("ProfilerStep"):
            totals[avg.key] = (avg.count, avg.self_cpu_time_total)
    return "cpu ops", totals


def summarise(
    totals: dict[str, tuple[int, float]], batch: int, mode: str, source: str, seconds: float, top: int
):
    """The `DecodeProfile` of `totals` over `PROFILED_STEPS` steps: the `top` rows by time."""
    n = PROFILED_STEPS
    total_us = sum(us for _, us in totals.values())
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])
    rows = [
        KernelRow(name, calls / n, us / n, us / total_us if total_us else 0.0)
        for name, (calls, us) in ranked[:top]
    ]
    return DecodeProfile(
        batch=batch,
        steps=n,
        mode=mode,
        source=source,
        step_ms=seconds / n * 1e3,
        kernel_us_per_step=total_us / n,
        kernels_per_step=sum(calls for calls, _ in totals.values()) / n,
        rows=rows,
    )
