"""How many ranks a run has and on which device, counted where the launcher runs them: this machine's GPUs
for the local launcher, the host's GPUs handed to a container, the GPUs of the partition's nodes as `sinfo` shows
them for Slurm. The flags `--gpus`, `--nproc`, `--nodes` and `--rdzv-endpoint` are checked here, once.
"""

from __future__ import annotations

import os
import shutil

from zebra.core.errors import ZebraError
from zebra.launch.devices import host_gpus
from zebra.launch.slurm_spec import Sinfo, partition_gpus
from zebra.recipes import LaunchSpec
from zebra.train.run import RankLayout


def count_ranks(
    launch: LaunchSpec,
    *,
    gpus: int | None = None,
    nproc: int | None = None,
    nodes: int | None = None,
    rdzv_endpoint: str | None = None,
    sinfo: Sinfo | None = None,
) -> RankLayout:
    """The rank layout for `launch.launcher` from the flags (None: not given) and the recipe's `launch`
    (`sinfo`: the launch's answers from Slurm, which a Slurm run without GPUs per node asks for them)."""
    if gpus is not None and nproc is not None:
        raise ZebraError(
            "--gpus and --nproc exclude each other", fix="--gpus for GPU ranks, --nproc for CPU ranks"
        )
    count = nodes or launch.nodes
    device, per_node = _ranks_per_node(launch, gpus, nproc, sinfo)
    _check_rendezvous(launch.launcher, count, rdzv_endpoint)
    return RankLayout(device, count, per_node, rdzv_endpoint)


def _ranks_per_node(
    launch: LaunchSpec, gpus: int | None, nproc: int | None, sinfo: Sinfo | None = None
) -> tuple[str, int]:
    if nproc is not None:
        return "cpu", nproc
    wanted = launch.gpus if gpus is None else gpus
    if launch.launcher == "local":
        return _local_gpus(gpus, wanted)
    if wanted:
        return "cuda", wanted
    if launch.launcher == "docker":
        _, count = host_gpus()
        return ("cuda", count) if count else ("cpu", 1)
    return "cuda", _slurm_node_gpus(launch.partition or None, sinfo)


def _slurm_node_gpus(partition: str | None, sinfo: Sinfo | None = None) -> int:
    """The GPUs each node of `partition` has (sinfo's gres), when they all have the same number, more than 0."""
    question = "--launcher slurm: how many ranks per node? launch.gpus is 0 and"
    fix = "pass --gpus N (GPUs per node; one task per GPU), or --nproc N for CPU ranks"
    if not shutil.which("sinfo"):
        raise ZebraError(f"{question} no Slurm client here (sinfo) shows the nodes' GPUs", fix=fix)
    counts = partition_gpus(partition, sinfo)
    if len(counts) == 1 and (gpus := next(iter(counts))) > 0:
        return gpus
    where = f"partition {partition}" if partition else "the default partition"
    nodes = ", ".join(f"{n} node(s) with {g or 'no'} GPU(s)" for g, n in sorted(counts.items()))
    raise ZebraError(f"{question} {where} has {nodes or 'no nodes'} (sinfo)", fix=fix)


def _local_gpus(gpus: int | None, wanted: int) -> tuple[str, int]:
    """(device, ranks) on this machine: the GPUs torch sees (all of them when `wanted` is 0), else one CPU."""
    visible = _visible_gpus()
    if gpus is not None and visible == 0:
        raise ZebraError(f"--gpus {gpus}: no GPU is visible here", fix="train on CPU ranks with --nproc N")
    if visible == 0:
        return "cpu", 1
    if wanted > visible:
        raise ZebraError(
            f"--gpus {wanted}: only {visible} GPU(s) visible", fix=f"pass --gpus {visible} or fewer"
        )
    return "cuda", wanted or visible


def _visible_gpus() -> int:
    """The GPUs torch sees here. A machine without a GPU driver's device files (ROCm's /dev/kfd, NVIDIA's
    /dev/nvidiaN, WSL's /dev/dxg) has none, which is told without importing torch (a `--dry-run` stays fast)."""
    if host_gpus() == (None, 0) and not os.path.exists("/dev/dxg"):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_rendezvous(launcher: str, nodes: int, rdzv_endpoint: str | None) -> None:
    if launcher == "slurm" and rdzv_endpoint:
        raise ZebraError(
            "--rdzv-endpoint: the slurm launcher takes the rendezvous from the job's first node",
            fix="drop --rdzv-endpoint",
        )
    if launcher == "local" and nodes > 1 and not rdzv_endpoint:
        raise ZebraError(
            f"--nodes {nodes}: the local launcher needs a rendezvous endpoint",
            fix="pass --rdzv-endpoint HOST:PORT (the same on every node), or launch through Slurm",
        )
    if launcher == "docker" and nodes > 1 and not rdzv_endpoint:
        raise ZebraError(
            f"--nodes {nodes} with --launcher docker: each node's container needs the rendezvous endpoint",
            fix="pass --rdzv-endpoint HOST:PORT and run the same command on every node, or use --launcher slurm",
        )
