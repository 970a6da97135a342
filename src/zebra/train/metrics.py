"""Throughput, model FLOPs utilisation (MFU) and the metric sinks: metrics.jsonl, TensorBoard, Weights & Biases.

MFU = train_flops_per_token x tokens/s / (ranks x peak dense bf16 FLOP/s of one device), where
train_flops_per_token = 6 N + causal MLA attention (`zebra.spec.arch.train_flops_per_token`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from zebra.core.errors import reading

# Peak dense bf16 FLOP/s per device (vendor datasheets, no sparsity). First substring match of the device name wins.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("H800", 989e12),
    ("H20", 148e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
    ("MI355X", 2.5e15),
    ("MI350X", 2.3e15),
    ("MI325X", 1307e12),
    ("MI300X", 1307e12),
    ("MI300A", 981e12),
    ("MI250X", 383e12),
    ("MI250", 362e12),
    ("MI210", 181e12),
)


def peak_flops(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of a device by its name (`torch.cuda.get_device_name`), None when unknown."""
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower() in device_name.lower():
            return flops
    return None


def device_peak_flops(device) -> float | None:
    """Peak of a torch device; None on CPU or for an unknown GPU (`ZEBRA_PEAK_FLOPS` overrides)."""
    if os.environ.get("ZEBRA_PEAK_FLOPS"):
        return float(os.environ["ZEBRA_PEAK_FLOPS"])
    if device.type != "cuda":
        return None
    import torch

    return peak_flops(torch.cuda.get_device_name(device))


def mfu(flops_per_token: float, tokens_per_s: float, n_devices: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None without a known peak."""
    if not peak or tokens_per_s <= 0:
        return None
    return flops_per_token * tokens_per_s / (n_devices * peak)


def process_seconds() -> float | None:
    """Seconds since this process started (Linux `/proc`; None where that cannot be read): with the end of the
    first optimizer step, the time to first step a user waits (imports, build, data, kernel compilation)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")  # field 22, since boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(uptime - started, 0.0)


def peak_memory_gb(device) -> float:
    """Peak memory of this rank: CUDA allocator peak on GPUs, max resident set size of the process on CPU."""
    if device.type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**30
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30


def clean(record: dict[str, Any]) -> dict[str, Any]:
    """Floats rounded for the log; NaN / inf written as strings (JSON has no literal for them)."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        if isinstance(v, float):
            v = str(v) if not math.isfinite(v) else float(f"{v:.6g}")
        out[k] = v
    return out


class IntervalMeter:
    """Training loss and throughput since the last log line; evaluation and checkpoint time is left out."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss_sum, self.steps, self.tokens, self.paused_s = 0.0, 0, 0, 0.0
        self.metric_sums: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def add(self, loss: float, tokens: int, applied: bool, metrics: dict[str, float] | None = None) -> None:
        """One optimizer step (with the loss's parts, e.g. distillation's KL); a skipped (non-finite) step counts
        its tokens but not its loss."""
        self.tokens += tokens
        if applied:
            self.loss_sum += loss
            self.steps += 1
            for k, v in (metrics or {}).items():
                self.metric_sums[k] = self.metric_sums.get(k, 0.0) + v

    def metrics(self) -> dict[str, float]:
        """The interval's mean of each reported part of the loss (read before `read`, which resets)."""
        return {k: v / self.steps for k, v in self.metric_sums.items()} if self.steps else {}

    @contextlib.contextmanager
    def paused(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.paused_s += time.perf_counter() - start

    def read(self) -> tuple[float, float, float]:
        """(mean loss, tokens/s, seconds of training) of the interval, then start the next one."""
        elapsed = time.perf_counter() - self.t0 - self.paused_s
        loss = self.loss_sum / self.steps if self.steps else float("nan")
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        self.reset()
        return loss, rate, elapsed


class MetricsLog:
    """Rank 0's metric sinks. `metrics.jsonl` always; TensorBoard when installed (`<run>/tensorboard`, turn off
    with ZEBRA_TENSORBOARD=0); Weights & Biases when installed and WANDB_PROJECT is set (its key is read by
    wandb from the environment, never by zebra)."""

    def __init__(self, run_dir: Path, *, resume_step: int, config: dict[str, Any], run_name: str):
        self.path = run_dir / "metrics.jsonl"
        truncate_after(self.path, resume_step)
        self._file = self.path.open("a")
        self._tb = self._open_tensorboard(run_dir)
        self._wandb = self._open_wandb(run_dir, config, run_name)

    @staticmethod
    def _open_tensorboard(run_dir: Path):
        if os.environ.get("ZEBRA_TENSORBOARD", "1") == "0":
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
        return SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    @staticmethod
    def _open_wandb(run_dir: Path, config: dict[str, Any], run_name: str):
        if not os.environ.get("WANDB_PROJECT"):
            return None
        try:
            import wandb
        except ImportError:
            return None
        return wandb.init(
            project=os.environ["WANDB_PROJECT"],
            name=run_name,
            id=run_name,
            resume="allow",
            dir=str(run_dir),
            config=config,
        )

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (it must carry `step`) to every sink."""
        record = clean(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        step = record["step"]
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, int | float)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(f"{'val' if k.startswith('val_') else 'train'}/{k}", v, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl: a line that is not a JSON object with an integer `step` (a torn last line
    from a crash, bytes that are not UTF-8, an edit) is skipped."""
    records = []
    if not path.is_file():
        return records
    with reading(path, what="a metrics.jsonl written by zebra train"):
        lines = path.read_bytes().splitlines()
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            continue
        if isinstance(record, dict) and type(record.get("step")) is int:
            records.append(record)
    return records


def truncate_after(path: Path, step: int) -> None:
    """Drop records past `step` (written after the checkpoint a resumed run restarts from), atomically."""
    if not path.is_file():
        return
    from zebra.core.atomic import write_atomic

    keep = [r for r in read_metrics(path) if r["step"] <= step]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))
