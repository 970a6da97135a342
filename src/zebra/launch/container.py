"""The container that runs one node's ranks, as data: image, GPUs, mounts, environment, the IPC/network/security
options ROCm and the collectives need, and the command. `zebra.launch.docker` runs it; the Slurm launcher
with `launch.container` runs one per node.

Host networking only: the rendezvous and collectives bind where the host's do. The container runs this
zebra: the project (or the installed packages) is bound read-only and put on PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import zebra
from zebra.launch.commands import cpu_threads_per_rank
from zebra.launch.devices import amd_options, guess_vendor, nvidia_options
from zebra.launch.environment import EnvVar, Mount, hf_cache, masked, parse_mount
from zebra.train.run import TrainRun


@dataclass
class ContainerSpec:
    """One container: what `docker run` would be given. `env` values of secrets are masked when shown."""

    image: str
    command: list[str]  # the ranks' command (torchrun or one rank's entry)
    name: str
    mounts: list[Mount]
    env: list[EnvVar]
    gpu_vendor: str | None  # amd | nvidia | None (CPU ranks)
    gpus: int
    devices: list[str] = field(default_factory=list)
    group_add: list[str] = field(default_factory=list)
    cap_add: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    shm_size: str = "64g"
    user: str | None = None
    workdir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)
    ipc_mode: str = "host"
    network_mode: str = "host"
    python: str = "python3"
    init: bool = True  # docker --init: PID 1 forwards signals and reaps zombies
    setup: str = ""  # shell line run before `command` (launch.container_setup)

    @property
    def full_command(self) -> list[str]:
        """What the container runs: `command`, after `setup` when there is one."""
        if not self.setup:
            return self.command
        return ["/bin/sh", "-c", f"{self.setup} && exec {shlex.join(self.command)}"]

    def describe(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "name": self.name,
            "gpu_vendor": self.gpu_vendor,
            "gpus": self.gpus,
            "devices": self.devices,
            "device_requests": [{"driver": "nvidia", "count": self.gpus, "capabilities": [["gpu"]]}]
            if self.gpu_vendor == "nvidia"
            else [],
            "group_add": self.group_add,
            "cap_add": self.cap_add,
            "security_opt": self.security_opt,
            "ipc_mode": self.ipc_mode,
            "network_mode": self.network_mode,
            "shm_size": self.shm_size,
            "user": self.user,
            "workdir": self.workdir,
            "init": self.init,
            "mounts": [m.describe() for m in self.mounts],
            "env": masked(self.env),
            "command": shlex.join(self.full_command),
        }

    def without_secret_values(self) -> ContainerSpec:
        """This spec with secret values dropped: they are read again where the container starts."""
        return replace(self, env=[v.without_secret() for v in self.env])


def container_name(run_dir: str) -> str:
    """A name that says which run a container belongs to: `zebra-<run>-<hash of its path>`."""
    base = re.sub(r"[^a-zA-Z0-9_.-]", "-", os.path.basename(run_dir.rstrip("/")))[:40] or "run"
    return f"zebra-{base}-{hashlib.sha1(run_dir.encode()).hexdigest()[:8]}"


def project_source() -> tuple[list[Mount], list[str]]:
    """The mounts that bring this zebra into a container and the PYTHONPATH entries that import it.

    A source checkout (pyproject.toml beside src/zebra) is bound read-only at its own path; an installed
    zebra binds its two packages under /opt/zebra.
    """
    package = Path(zebra.__file__).resolve().parent
    root = package.parents[1]
    kernels = Path(importlib.util.find_spec("zebra_kernels").origin).resolve().parent  # not imported: torch
    if (root / "pyproject.toml").is_file() and package.parent.name == "src":
        return [Mount(str(root), str(root), True, "project")], [str(root / "src"), str(kernels.parent)]
    mounts = [
        Mount(str(package), "/opt/zebra/zebra", True, "project"),
        Mount(str(kernels), "/opt/zebra/zebra_kernels", True, "project"),
    ]
    return mounts, ["/opt/zebra"]


def _inside(path: str, mounts: list[Mount]) -> bool:
    return any(
        path == m.source or path.startswith(m.source.rstrip("/") + "/")
        for m in mounts
        if m.target == m.source
    )


def container_mounts(run: TrainRun) -> list[Mount]:
    """What a container running `run` binds: the project, the run directory, the data and tokenizer folders,
    the distillation teacher's and the `train.init` export's folders, a `--resume PATH` checkpoint's, the HF
    cache, then the recipe's `launch.mounts` (which win on a clash)."""
    mounts, _ = project_source()
    run_dir = str(run.run_dir.resolve())
    mounts.append(Mount(run_dir, run_dir, False, "run"))
    for entry in run.recipe.data.paths if not run.recipe.data.mock else []:
        folder = str(Path(entry.target).parent)
        if not _inside(folder, mounts):
            mounts.append(Mount(folder, folder, True, "data"))
    local = (
        ("tokenizer", run.recipe.data.tokenizer),
        ("teacher", run.recipe.distill.teacher),
        ("init", run.recipe.train.init),
        ("resume", None if run.resume in ("auto", "never") else run.resume),  # --resume PATH of another run
    )
    for (
        purpose,
        value,
    ) in local:  # a folder, or the folder of a file (.gguf, Megatron .pt); hub ids are not paths
        path = Path(value).expanduser() if value else None
        if path is not None and path.exists() and not _inside(str(path.resolve()), mounts):
            source = str(path.resolve() if path.is_dir() else path.resolve().parent)
            mounts.append(Mount(source, source, True, purpose))
    cache = hf_cache()
    if cache.is_dir():
        mounts.append(Mount(str(cache), str(cache), False, "hf-cache"))
    user = [parse_mount(m) for m in run.recipe.launch.mounts]
    taken = {m.target for m in user}
    return [m for m in mounts if m.target not in taken] + user


def _container_env(run: TrainRun, env: list[EnvVar], mounts: list[Mount]) -> list[EnvVar]:
    """The ranks' variables plus what the container itself needs (PYTHONPATH, HF_HOME, threads, HOME)."""
    variables = {v.name: v for v in env}
    added = {"PYTHONPATH": os.pathsep.join(project_source()[1]), "PYTHONUNBUFFERED": "1"}
    if any(m.purpose == "hf-cache" for m in mounts):
        added["HF_HOME"] = str(hf_cache())
    if run.ranks.device == "cpu" and "OMP_NUM_THREADS" not in variables:
        added["OMP_NUM_THREADS"] = str(cpu_threads_per_rank(run.ranks.ranks_per_node))
    if os.getuid() != 0:  # the container runs as the user (see container_spec): give it a writable HOME
        added["HOME"] = "/tmp"
    variables.update({k: EnvVar(k, v) for k, v in added.items()})
    return sorted(variables.values(), key=lambda v: v.name)


def container_spec(run: TrainRun, *, command: list[str], env: list[EnvVar]) -> ContainerSpec:
    """The container that runs one node of `run` with `command`, passing `env` to its ranks."""
    spec, ranks = run.recipe.launch, run.ranks
    mounts = container_mounts(run)
    vendor = guess_vendor(spec.gpu_vendor, spec.image) if ranks.device == "cuda" else None
    options: dict[str, Any] = {}
    if vendor == "amd":
        options = amd_options()
    elif vendor == "nvidia":
        options = nvidia_options(ranks.gpus_per_node)
        options.pop("gpus")
    run_dir = str(run.run_dir.resolve())
    return ContainerSpec(
        image=spec.image,
        command=command,
        setup=spec.container_setup,
        name=container_name(run_dir),
        mounts=mounts,
        env=_container_env(run, env, mounts),
        gpu_vendor=vendor,
        gpus=ranks.gpus_per_node,
        shm_size=spec.shm_size,
        user=f"{os.getuid()}:{os.getgid()}" if os.getuid() != 0 else None,  # files in the run stay the user's
        workdir=run_dir,
        labels={"zebra.run_dir": run_dir, "zebra.recipe": run.recipe.name},
        python=spec.container_python,
        init=spec.container_init,
        **options,
    )
