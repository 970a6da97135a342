"""The distributed environment of one training rank: who am I, which device, and the collectives the loop needs.

Ranks learn their place from torchrun / the elastic agent (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
`MASTER_PORT`) or, when started by Slurm one task per GPU, from `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`
and the job's node list. A world of one rank needs no process group at all.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DistEnv:
    """This rank's place in the job."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def slurm_to_torch_env(environ: dict[str, str]) -> dict[str, str]:
    """The torchrun variables derived from a Slurm task's environment (empty when not under Slurm).

    MASTER_ADDR is the first host of the job's node list; MASTER_PORT is derived from the job id so that
    every task of a job agrees on it without talking to the others.
    """
    if "RANK" in environ or "SLURM_PROCID" not in environ or "SLURM_NTASKS" not in environ:
        return {}
    env = {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": environ["SLURM_NTASKS"],
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
    }
    if "MASTER_ADDR" not in environ:
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "127.0.0.1")
        env["MASTER_ADDR"] = first_slurm_host(nodelist)
    if "MASTER_PORT" not in environ:
        env["MASTER_PORT"] = str(20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000)
    return env


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: `node[03-05,09],gpu1` -> `node03` (scontrol when available)."""
    try:
        res = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10
        )
        if res.returncode == 0 and res.stdout.strip():
            return res.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    first = re.split(r",(?![^\[]*\])", nodelist)[0]
    m = re.fullmatch(r"(.*)\[([^\]]+)\](.*)", first)
    if not m:
        return first
    head, ranges, tail = m.groups()
    return f"{head}{ranges.split(',')[0].split('-')[0]}{tail}"


def pick_device(kind: str, local_rank: int) -> torch.device:
    """`cuda` (also ROCm) when asked or when `auto` finds a GPU, else `cpu`."""
    import torch

    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ZebraError("no GPU visible to this rank", fix="train on CPU with --nproc N instead of --gpus")
    count = torch.cuda.device_count()
    index = 0 if count == 1 else local_rank  # one visible GPU: Slurm / containers bound this task to it
    if index >= count:
        raise ZebraError(
            f"local rank {local_rank} has no GPU ({count} visible)",
            fix="start at most one rank per visible GPU",
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_distributed(device_kind: str = "auto") -> DistEnv:
    """Read this rank's environment, pick its device and, for more than one rank, join the process group."""
    import datetime

    import torch.distributed as dist

    os.environ.update(slurm_to_torch_env(dict(os.environ)))
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_kind, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world,
            device_id=device if device.type == "cuda" else None,
            timeout=datetime.timedelta(minutes=30),
        )
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world, device=device)


def destroy_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum `tensor` over all ranks in place (a no-op for one rank) and return it."""
    if env.distributed:
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(env: DistEnv) -> None:
    if env.distributed:
        import torch.distributed as dist

        dist.barrier()


def broadcast_object(obj, env: DistEnv):
    """Rank 0's `obj` on every rank."""
    if not env.distributed:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
