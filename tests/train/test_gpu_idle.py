"""zebra.bench.gpu_idle on Chrome traces shaped as torch's profiler writes them (kernels, their launches through
the runtime or driver API, the CPU ops around the launches): which gaps the GPU sat idle, and whose launch ended
each."""

from __future__ import annotations

import json

from zebra.bench.gpu_idle import idle_gaps


def kernel(name, ts, dur, corr, cat="kernel"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": 7, "args": {"correlation": corr}}


def launch(ts, corr, cat="cuda_runtime"):
    return {
        "cat": cat,
        "name": "cudaLaunchKernel",
        "ts": ts,
        "dur": 3,
        "tid": 1,
        "args": {"correlation": corr},
    }


def op(name, ts, dur, tid=1, cat="cpu_op"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


TRACE = {
    "traceEvents": [
        op("aten::mm", 0, 10),
        launch(2, 1),
        kernel("gemm", 10, 100, 1),  # busy 10..110
        kernel("other_stream", 50, 80, 2),  # overlaps: busy to 130, no gap
        kernel("inside", 60, 5, 7),  # within both: busy still to 130
        launch(30, 2),
        op("aten::item", 100, 5),  # the host waits, then launches the optimizer
        op("Optimizer.step#AdamW.step", 120, 100, cat="user_annotation"),  # a record_function range
        op("aten::_fused_adamw_", 180, 30),
        launch(185, 3),
        kernel("multi_tensor_apply", 230, 40, 3),  # gap 130..230, launched inside _fused_adamw_
        launch(215, 6),  # inside the annotation only
        kernel("adamw_tail", 300, 3, 6),  # gap 270..300
        op("aten::add", 275, 2, tid=2),  # another thread's op around the next launch: not its launcher
        launch(275, 4, cat="cuda_driver"),  # a Triton kernel, no op around its launch
        kernel("triton_norm", 308, 10, 4),  # gap 5 us: below the threshold, summed only
        kernel("memcpy", 373, 5, 5, cat="gpu_memcpy"),  # gap 55 us, its launch is not in the trace
    ]
}


def test_gaps_are_found_between_merged_busy_intervals_and_named_by_their_launcher():
    report = idle_gaps(TRACE, min_gap_us=20)
    assert [(g.us, g.next_kernel, g.launched_by) for g in report.gaps] == [
        (100, "multi_tensor_apply", "aten::_fused_adamw_"),
        (30, "adamw_tail", "Optimizer.step#AdamW.step"),
        (55, "memcpy", "(no launch found)"),
    ]
    assert report.small_gaps_us == 5
    assert report.span_us == 378 - 10 and report.idle_us == 190 and report.busy_us == 178
    assert report.by_launcher() == [
        ("aten::_fused_adamw_", 1, 100),
        ("(no launch found)", 1, 55),
        ("Optimizer.step#AdamW.step", 1, 30),
    ]


def test_a_launch_outside_any_cpu_op_and_a_lower_threshold():
    report = idle_gaps(json.loads(json.dumps(TRACE["traceEvents"])), min_gap_us=1)  # the bare event list
    assert [(g.next_kernel, g.launched_by) for g in report.gaps][2] == ("triton_norm", "(no op)")
    assert report.small_gaps_us == 0 and report.idle_us == 190
    assert idle_gaps({"traceEvents": [op("aten::mm", 0, 10)]}).span_us == 0
