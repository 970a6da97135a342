"""The GPUs of this machine as a container runtime sees them (vendor and count, found without torch), and the
container options that hand them to a container.

- AMD (ROCm): the devices `/dev/kfd` and `/dev/dri` (plus `/dev/infiniband` for RDMA when present), the
  groups that own them, `SYS_PTRACE` and an unconfined seccomp profile, host IPC for the collectives' shared
  memory: the flags of the ROCm / Primus `docker run` line.
- NVIDIA: a device request for N GPUs (`--gpus N`, through the NVIDIA container toolkit).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from zebra.core.errors import ZebraError

VENDORS = ("amd", "nvidia")
AMD_DEVICES = ("/dev/kfd", "/dev/dri")
RDMA_DEVICE = "/dev/infiniband"
KFD_TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"


def amd_gpu_count(topology: str = KFD_TOPOLOGY) -> int:
    """GPUs the ROCm kernel driver lists (topology nodes with a non-zero gpu_id; CPUs have 0)."""
    count = 0
    for gpu_id in glob.glob(os.path.join(topology, "*", "gpu_id")):
        try:
            count += int(Path(gpu_id).read_text().strip() or 0) != 0
        except (OSError, ValueError):
            continue
    return count


def nvidia_gpu_count(dev: str = "/dev") -> int:
    """GPUs the NVIDIA driver exposes (`/dev/nvidia0`, `/dev/nvidia1`, ...)."""
    return sum(1 for p in glob.glob(os.path.join(dev, "nvidia[0-9]*")) if p[len(dev) + 7 :].isdigit())


def host_gpus() -> tuple[str | None, int]:
    """(vendor, count) of this machine's GPUs; (None, 0) without any."""
    if os.path.exists("/dev/kfd"):
        return "amd", amd_gpu_count()
    count = nvidia_gpu_count()
    return ("nvidia", count) if count else (None, 0)


def guess_vendor(setting: str, image: str) -> str:
    """The GPU vendor for `launch.gpu_vendor`: as set, else this machine's, else the image name's hint.

    Raises:
        ZebraError: `auto` and neither this machine nor the image name tells.
    """
    if setting in VENDORS:
        return setting
    vendor, _ = host_gpus()
    if vendor:
        return vendor
    name = image.lower()
    if "rocm" in name or "primus" in name or "amd" in name:
        return "amd"
    if "nvidia" in name or "nvcr.io" in name or "cuda" in name:
        return "nvidia"
    raise ZebraError(
        f"cannot tell which GPUs image {image} is for (no GPU on this machine, launch.gpu_vendor auto)",
        fix="pass --set launch.gpu_vendor=amd or --set launch.gpu_vendor=nvidia",
    )


def device_groups(paths: tuple[str, ...] = AMD_DEVICES) -> list[str]:
    """Numeric ids of the groups owning the AMD device nodes here (`video`, `render`), as `--group-add` takes
    them; numbers work whether or not the image knows the group names."""
    gids = set()
    for path in paths:
        nodes = [path, *glob.glob(os.path.join(path, "*"))] if os.path.isdir(path) else [path]
        for node in nodes:
            try:
                gid = os.stat(node).st_gid
            except OSError:
                continue
            if gid:
                gids.add(str(gid))
    return sorted(gids, key=int)


def amd_options() -> dict:
    """Container options for AMD GPUs (Docker SDK names)."""
    devices = [*AMD_DEVICES, *([RDMA_DEVICE] if os.path.exists(RDMA_DEVICE) else [])]
    return {
        "devices": [f"{d}:{d}:rwm" for d in devices],
        "group_add": device_groups() or ["video"],
        "cap_add": ["SYS_PTRACE"],
        "security_opt": ["seccomp=unconfined"],
    }


def nvidia_options(count: int) -> dict:
    """Container options for `count` NVIDIA GPUs (-1: all)."""
    return {"gpus": count, "cap_add": ["SYS_PTRACE"], "security_opt": []}
