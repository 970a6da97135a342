"""How ranks start, whatever the launcher: the argv of one rank, the argv of torchrun starting one node's ranks,
and the torchrun variables a rank reads when something other than torchrun starts it.

- `rank_command(run_dir)`: `python -m zebra.cli.rank RUN_DIR --resume ... --device ...`;
- `torchrun_command(run_dir, ...)`: every rank of one node (a container, a Slurm node with a container);
- `rank_env(...)`: RANK, WORLD_SIZE, ... for a rank a Slurm task starts itself.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from zebra.core.cpus import usable_cpus
from zebra.core.errors import ZebraError

RANK_MODULE = "zebra.cli.rank"  # the program every rank runs


def rank_command(
    run_dir: str | Path, *, resume: str = "auto", device: str = "auto", python: str | None = None
) -> list[str]:
    """argv of one training rank."""
    return [
        python or sys.executable,
        "-m",
        RANK_MODULE,
        str(run_dir),
        "--resume",
        resume,
        "--device",
        device,
    ]


def rank_env(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    threads: int | None = None,
) -> dict[str, str]:
    """Environment variables a rank needs when started without torchrun (values are never secrets)."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_id(run_dir: str | Path) -> str:
    """A rendezvous id every node of one run derives alike (from the run directory's absolute path)."""
    return "zebra-" + hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


def require_rendezvous(nnodes: int, rdzv_endpoint: str | None) -> None:
    """Several nodes meet at a rendezvous endpoint: a one-line ZebraError without one."""
    if nnodes > 1 and not rdzv_endpoint:
        raise ZebraError("a multi-node run needs a rendezvous endpoint", fix="pass --rdzv-endpoint HOST:PORT")


def torchrun_command(
    run_dir: str | Path,
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    resume: str = "auto",
    device: str = "auto",
    python: str | None = None,
) -> list[str]:
    """argv starting every rank of one node with torchrun (`python -m torch.distributed.run`)."""
    py = python or sys.executable
    cmd = [py, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}", f"--nnodes={nnodes}"]
    if nnodes == 1 and not rdzv_endpoint:
        cmd.append("--standalone")
    else:
        require_rendezvous(nnodes, rdzv_endpoint)
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={run_id(run_dir)}"]
    return [*cmd, *rank_command(run_dir, resume=resume, device=device)[1:]]


def cpu_threads_per_rank(nproc_per_node: int) -> int:
    """CPU threads for each rank so that the ranks of a node do not oversubscribe its cores."""
    return max(1, usable_cpus() // nproc_per_node)
