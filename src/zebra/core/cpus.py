"""How many CPU cores this process may use: the ones its affinity allows (a Slurm step or a container may be
given fewer than the machine has), else all of them."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
