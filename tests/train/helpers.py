"""Helpers of the training tests: fast overrides for the tiny recipes and ways to watch a real `zebra train`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Small enough for a few seconds per run on 2 CPU cores: 8 sequences x 32 tokens per step, a log line per step.
FAST = [
    "data.seq_len=32",
    "train.global_batch_size=8",
    "train.micro_batch_size=8",
    "train.warmup_steps=2",
    "train.log_interval=1",
    "train.eval_interval=0",
    "train.save_interval=0",
    "train.export=false",
    "train.lr=5e-3",
    "train.min_lr=5e-4",
]
ENTRY = "import sys; sys.argv[0] = 'zebra'; from zebra.cli.main import main; main()"


def sets(*overrides: str) -> list[str]:
    """`--set` flags for FAST plus `overrides` (later ones win)."""
    return [arg for o in (*FAST, *overrides) for arg in ("--set", o)]


def zebra_process(*args: str, **popen) -> subprocess.Popen:
    """A real `zebra ...` process (signals reach it as they would from Slurm or a terminal)."""
    return subprocess.Popen(
        [sys.executable, "-c", ENTRY, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        **popen,
    )


def records(run_dir: Path) -> list[dict]:
    """Every line of a run's metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_records(run_dir: Path) -> list[dict]:
    """The training-step lines of a run's metrics.jsonl (those with a loss; not eval or timing lines)."""
    return [r for r in records(run_dir) if "loss" in r]


def losses(run_dir: Path) -> dict[int, float]:
    """Training loss per logged step of a run."""
    return {r["step"]: r["loss"] for r in train_records(run_dir)}


def invoke_in_process(*args: str):
    """`zebra ...` in this process -> click Result (for module fixtures, which cannot use the `cli` fixture)."""
    from typer.testing import CliRunner

    from zebra.cli.main import app

    return CliRunner().invoke(app, list(args))


def distil(cli, data, out: Path, run: str, teacher: Path, student: Path, *extra: str, steps: int, stage=()):
    """`zebra train tiny --init student --teacher teacher` for `steps` steps into out/run (FAST, a checkpoint
    every 3 steps, lr 2e-3, then the `stage` overrides and `extra` flags); asserts it succeeded."""
    result = cli("train", "tiny", "--data", data, "--init", str(student), "--teacher", str(teacher),
                 "--max-steps", str(steps), "--output", str(out), "--run", run,
                 *sets("train.save_interval=3", "train.lr=2e-3", *stage), *extra)  # fmt: skip
    assert result.exit_code == 0, result.output
    return result


def upcycled_student(out: Path, teacher: Path, mla: int) -> Path:
    """`teacher` upcycled into a GDN hybrid with `mla` MLA layers at `out` (seed 5)."""
    from zebra.upcycle import StudentOptions, upcycle

    upcycle(str(teacher), out, StudentOptions(mixer="gdn", mla=mla), seed=5)
    return out


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Poll `predicate()` until true; fail if the process ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"process ended early with {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("timed out waiting for the run")
        time.sleep(0.02)


def logged_step(run_dir: Path) -> int:
    """The last step in metrics.jsonl (0 before the first log line)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]
    return max(steps, default=0)


def write_fla_folder(root: Path, seq_len: int, documents: int = 40) -> Path:
    """FLA's preprocess over generated text with the byte tokenizer (ids are UTF-8 bytes): concatenated without
    EOD, cut into `seq_len`-token chunks, saved as an Arrow dataset, then `zebra data convert-fla`d.

    Returns:
        The convert-fla data folder.
    """
    import datasets

    from zebra.data.bundled_corpus import generate_documents
    from zebra.data.fla_dataset import convert_fla

    stream = [b for text in generate_documents(seed=3, num_documents=documents) for b in text.encode()]
    chunks = [stream[i : i + seq_len] for i in range(0, len(stream) // seq_len * seq_len, seq_len)]
    datasets.Dataset.from_dict({"input_ids": chunks}).save_to_disk(str(root / "arrow"))
    convert_fla(root / "arrow", root / "chunks", tokenizer="byte")
    return root / "chunks"


def cpu_and_gpu() -> list:
    """`device` parameters: "cpu", and "cuda" marked `gpu` (skipped where there is none)."""
    import torch

    no_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    return ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, no_gpu])]
