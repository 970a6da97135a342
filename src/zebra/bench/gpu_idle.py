"""Where the GPU waits on the host: idle gaps in a torch profiler trace (Chrome trace JSON, `prof.export_chrome_trace`).

A training step whose wall time exceeds its CUDA time (1b-gdn-pure's, in docs/benchmarks.md) leaves the GPU idle
between kernels. Each gap ends when the host launches the next kernel; the CPU op that launched it (matched through
the launch's correlation id) says what the host was doing: a synchronising `.item()`, the optimizer's launches, a
chain of small kernels whose launches cost more than they run.

    report = idle_gaps(json.load(gzip.open("trace.json.gz")), min_gap_us=20)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = (
    "cuda_runtime",
    "cuda_driver",
)  # cudaLaunchKernel, cudaMemcpyAsync; Triton's cuLaunchKernel
HOST_CATEGORIES = ("cpu_op", "user_annotation")  # aten ops; record_function ranges such as Optimizer.step


@dataclass
class Gap:
    """One interval with no GPU work: `us` long, ending when `next_kernel` (launched by `launched_by`) starts."""

    us: float
    next_kernel: str
    launched_by: str


@dataclass
class IdleReport:
    """The GPU's idle time between its first and its last event: the gaps of at least the threshold one by one,
    shorter ones only summed (`small_gaps_us`)."""

    span_us: float
    gaps: list[Gap] = field(default_factory=list)
    small_gaps_us: float = 0.0

    @property
    def idle_us(self) -> float:
        return sum(g.us for g in self.gaps) + self.small_gaps_us

    @property
    def busy_us(self) -> float:
        return self.span_us - self.idle_us

    def by_launcher(self) -> list[tuple[str, int, float]]:
        """(launching op, gaps, idle us) summed over the gaps, most idle first."""
        totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for gap in self.gaps:
            totals[gap.launched_by][0] += 1
            totals[gap.launched_by][1] += gap.us
        return sorted(((op, int(n), us) for op, (n, us) in totals.items()), key=lambda row: -row[2])


def _innermost_op(ops: list[dict[str, Any]], tid: Any, ts: float) -> str:
    """The shortest host op or annotation on thread `tid` whose interval holds `ts`; "(no op)" when none does."""
    holding = [op for op in ops if op.get("tid") == tid and op["ts"] <= ts <= op["ts"] + op.get("dur", 0)]
    return min(holding, key=lambda op: op.get("dur", 0))["name"] if holding else "(no op)"


def idle_gaps(trace: dict[str, Any] | list[dict[str, Any]], min_gap_us: float = 20.0) -> IdleReport:
    """The GPU's idle gaps in a Chrome trace (the dict `export_chrome_trace` writes, or its event list)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES and "ts" in e), key=lambda e: e["ts"])
    if not gpu:
        return IdleReport(span_us=0.0)
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    ops = [e for e in events if e.get("cat") in HOST_CATEGORIES and "ts" in e]
    report = IdleReport(span_us=gpu[-1]["ts"] + gpu[-1].get("dur", 0) - gpu[0]["ts"])
    busy_until = gpu[0]["ts"]
    for event in gpu:
        gap = event["ts"] - busy_until
        if gap >= min_gap_us:
            launch = launches.get(event.get("args", {}).get("correlation"))
            by = _innermost_op(ops, launch.get("tid"), launch["ts"]) if launch else "(no launch found)"
            report.gaps.append(Gap(us=gap, next_kernel=event["name"], launched_by=by))
        elif gap > 0:
            report.small_gaps_us += gap
        busy_until = max(busy_until, event["ts"] + event.get("dur", 0))
    return report
