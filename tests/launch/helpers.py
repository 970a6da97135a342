"""Shared pieces of the launcher tests (fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path

# A few seconds of training per rank: startup (imports) dominates every launcher test.
STEPS = 10
SETS = [
    "data.seq_len=32", "train.global_batch_size=4", "train.micro_batch_size=2", "train.log_interval=1",
    "train.eval_interval=0", "train.save_interval=2", "train.export=false",
]  # fmt: skip
TINY = ["tiny", "--mock-data", "--max-steps", str(STEPS), *(a for s in SETS for a in ("--set", s))]


def hostbind_flags(image) -> list[str]:
    """The test image's read-only binds (host /usr, /etc, Python) as `zebra train` flags."""
    flags = ["--image", image.name, "--set", f"launch.container_python={image.python}"]
    # The image's /sbin is a link into the bound /usr, where docker cannot place its init binary.
    flags += ["--set", "launch.container_init=false"]
    for source, bind in image.volumes.items():
        flags += ["--mount", f"{source}:{bind['bind']}:{bind['mode']}"]
    return flags


def losses(run_dir: Path) -> list[tuple[int, float]]:
    from zebra.train.metrics import read_metrics

    return [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
