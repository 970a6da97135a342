"""One training rank: `python -m zebra.cli.rank RUN_DIR [--resume auto|never|PATH] [--device auto|cpu|cuda]`.

This is what every launcher starts once per rank (the local elastic agent, containers, Slurm tasks). The rank
reads the resolved recipe from `RUN_DIR/config.yaml` and its place in the job from the torchrun variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or from Slurm's (SLURM_PROCID, SLURM_NTASKS, ...).
Rank 0 shows the run's progress; every rank reports its own error.

Exit codes: 0 the run finished, or a stop signal (SIGTERM / SIGUSR1 / SIGINT) arrived and a checkpoint was
saved (requeue it and `--resume auto` continues); 1 a user error (one line on stderr); 3 training stopped on
non-finite losses; 130 interrupted without saving (Ctrl-C twice).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from zebra.cli._output import out
from zebra.core.errors import ZebraError
from zebra.core.noise import quiet_library_noise
from zebra.train.trainer import train_rank


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m zebra.cli.rank", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="run directory holding config.yaml")
    parser.add_argument(
        "--resume", default="auto", help="auto (newest checkpoint), never, or a checkpoint PATH"
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_library_noise()
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    where = f"[rank {rank}] " if rank else ""
    try:
        train_rank(args.run_dir, resume=args.resume, device=args.device, view=out.train_view())
    except ZebraError as e:
        out.error(where + e.message)
        if e.fix and not rank:
            out.hint(e.fix)
        return e.exit_code
    except KeyboardInterrupt:
        out.error(where + "interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
