"""The launch plan: how the ranks of one run start, decided once and handed to a launcher.

`plan_run` resolves the run (the trainer's `RunPlan`) for the chosen launcher, counting ranks where they will
run rather than on this machine; `build_launch_plan` turns it into a `LaunchPlan`: ranks, nodes, GPUs per
node, environment (secrets masked when shown), mounts, image and command, plus the container spec (docker,
slurm with container) or the sbatch parameters (slurm). `--dry-run` prints `LaunchPlan.describe()`.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.errors import ZebraError
from zebra.launch.environment import EnvVar, masked, passthrough

if TYPE_CHECKING:
    from zebra.launch.container import ContainerSpec
    from zebra.launch.slurm import SlurmSpec
    from zebra.recipes import Recipe
    from zebra.train.plan import RunPlan

LAUNCHERS = ("local", "docker", "slurm")


@dataclass(frozen=True)
class Mount:
    """A host directory bound into the container (at the same path unless the user says otherwise)."""

    source: str
    target: str
    read_only: bool
    purpose: str  # project | data | run | hf-cache | tokenizer | user

    def describe(self) -> str:
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


def parse_mount(text: str) -> Mount:
    """`HOST[:CONTAINER][:ro|rw]` -> Mount (absolute paths; read-write unless `:ro`)."""
    parts = text.split(":")
    mode = "rw"
    if len(parts) > 1 and parts[-1] in ("ro", "rw"):
        mode = parts.pop()
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ZebraError(
            f"--mount {text!r}: expected HOST[:CONTAINER][:ro]", fix="e.g. --mount /data:/data:ro"
        )
    source = os.path.abspath(os.path.expanduser(parts[0]))
    target = parts[1] if len(parts) == 2 else source
    if not target.startswith("/"):
        raise ZebraError(f"--mount {text!r}: the container path {target!r} is not absolute")
    if not os.path.exists(source):
        raise ZebraError(f"--mount {text!r}: {source} does not exist", fix="create it or fix the path")
    return Mount(source, target, mode == "ro", "user")


@dataclass
class LaunchPlan:
    """Everything a launcher needs to start the ranks of one run.

    `command` is what starts one node's ranks (torchrun, or one rank's entry when the node has one rank); on
    Slurm without a container each task runs `rank_command` instead. Paths are absolute.
    """

    launcher: str
    run_dir: Path
    recipe: str
    device: str  # cuda | cpu
    nodes: int
    ranks_per_node: int
    resume: str
    env: list[EnvVar]
    command: list[str]
    rank_command: list[str]
    rdzv_endpoint: str | None = None
    image: str | None = None
    mounts: list[Mount] = field(default_factory=list)
    container: ContainerSpec | None = None
    slurm: SlurmSpec | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def gpus_per_node(self) -> int:
        return self.ranks_per_node if self.device == "cuda" else 0

    def describe(self) -> dict[str, Any]:
        """The complete plan as plain data, secret values masked (what `--dry-run` prints)."""
        info: dict[str, Any] = {
            "launcher": self.launcher,
            "run_dir": str(self.run_dir),
            "device": self.device,
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "gpus_per_node": self.gpus_per_node,
            "world_size": self.world_size,
            "resume": self.resume,
            "command": shlex.join(self.command),
            "env": masked(self.env),
        }
        if "torch.distributed.run" in self.command:  # the torchrun arguments, up to the rank entry
            info["torchrun"] = self.command[self.command.index("torch.distributed.run") + 1 :]
        if self.rdzv_endpoint:
            info["rdzv_endpoint"] = self.rdzv_endpoint
        if self.container is not None:
            info["container"] = self.container.describe()
        if self.slurm is not None:
            info["slurm"] = self.slurm.describe()
            info["rank_command"] = shlex.join(self.rank_command)
        return info


def _remote_ranks(recipe: Recipe, launcher: str, gpus: int | None, nproc: int | None) -> tuple[str, int]:
    """(device, ranks per node) where the ranks run: in a container here, or on Slurm's nodes."""
    if gpus is not None and nproc is not None:
        raise ZebraError(
            "--gpus and --nproc exclude each other", fix="--gpus for GPU ranks, --nproc for CPU ranks"
        )
    if nproc is not None:
        return "cpu", nproc
    wanted = recipe.launch.gpus if gpus is None else gpus
    if wanted:
        return "cuda", wanted
    if launcher == "docker":
        from zebra.launch.devices import host_gpus

        _, count = host_gpus()
        return ("cuda", count) if count else ("cpu", 1)
    raise ZebraError(
        "--launcher slurm: how many ranks per node? (launch.gpus is 0 and Slurm nodes are not visible from here)",
        fix="pass --gpus N (GPUs per node; one task per GPU), or --nproc N for CPU ranks",
    )


def plan_run(
    recipe_name: str | Path,
    *,
    launcher: str | None = None,
    overrides: Sequence[str] = (),
    gpus: int | None = None,
    nodes: int | None = None,
    nproc: int | None = None,
    rdzv_endpoint: str | None = None,
    mounts: Sequence[str] = (),
    sbatch_extra: Sequence[str] = (),
    env: Sequence[str] = (),
    **run_options: Any,
) -> RunPlan:
    """The trainer's `RunPlan` for `launcher` (default: the recipe's `launch.launcher`).

    The local launcher counts the GPUs of this machine (`zebra.train.plan.make_plan`); docker and slurm count
    ranks where they will run: `--gpus N` per node, `--nproc N` CPU ranks, or the recipe's `launch.gpus`.
    `mounts`, `sbatch_extra` and `env` extend the recipe's launch lists; `run_options` go to `make_plan`
    (data, mock_data, max_steps, output, run, resume).
    """
    from zebra.recipes import load_recipe
    from zebra.train.plan import make_plan

    sets = [*overrides, *([f"launch.launcher={launcher}"] if launcher else [])]
    recipe = load_recipe(recipe_name, overrides=sets)
    which = recipe.launch.launcher
    if which == "local":
        plan = make_plan(
            recipe_name,
            overrides=sets,
            gpus=gpus,
            nodes=nodes,
            nproc=nproc,
            rdzv_endpoint=rdzv_endpoint,
            **run_options,
        )
    else:
        if which == "slurm" and rdzv_endpoint:
            raise ZebraError(
                "--rdzv-endpoint: the slurm launcher takes the rendezvous from the job's first node",
                fix="drop --rdzv-endpoint",
            )
        count = nodes or recipe.launch.nodes
        if which == "docker" and count > 1 and not rdzv_endpoint:
            raise ZebraError(
                f"--nodes {count} with --launcher docker: each node's container needs the rendezvous endpoint",
                fix="pass --rdzv-endpoint HOST:PORT and run the same command on every node, or use --launcher slurm",
            )
        plan = make_plan(
            recipe_name,
            overrides=sets,
            nodes=count,
            rdzv_endpoint=rdzv_endpoint,
            ranks=lambda r: _remote_ranks(r, which, gpus, nproc),
            **run_options,
        )
    spec = plan.recipe.launch
    spec.mounts = [*spec.mounts, *mounts]
    spec.sbatch_extra = [*spec.sbatch_extra, *sbatch_extra]
    spec.env = [*spec.env, *env]
    return plan


def launch_overrides(**settings: Any) -> list[str]:
    """`--set`-style overrides of the recipe's launch section for the flags given (None: not given)."""
    sets = []
    for key, value in settings.items():
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        sets.append(f"launch.{key}={text}")
    return sets


def project_source() -> tuple[list[Mount], list[str]]:
    """The mounts that bring this zebra into a container and the PYTHONPATH entries that import it.

    A source checkout (pyproject.toml beside src/zebra) is bound read-only at its own path; an installed
    zebra binds its two packages under /opt/zebra.
    """
    import zebra
    import zebra_kernels

    package = Path(zebra.__file__).resolve().parent
    root = package.parents[1]
    kernels = Path(zebra_kernels.__file__).resolve().parent
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


def hf_cache() -> Path:
    """The Hugging Face cache folder ranks should share: HF_HOME, else ~/.cache/huggingface."""
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser().resolve()


def container_mounts(run: RunPlan, run_dir: Path) -> tuple[list[Mount], list[str]]:
    """(mounts, PYTHONPATH) for a container running `run`: the project, the run directory, the data and
    tokenizer folders, the HF cache, then the recipe's and the command line's mounts (which win on a clash)."""
    mounts, pythonpath = project_source()
    mounts.append(Mount(str(run_dir), str(run_dir), False, "run"))
    for entry in run.recipe.data.paths if not run.recipe.data.mock else []:
        prefix = entry.rsplit(":", 1)[0] if ":" in entry else entry
        folder = str(Path(prefix).parent)
        if not _inside(folder, mounts):
            mounts.append(Mount(folder, folder, True, "data"))
    tokenizer = Path(run.recipe.data.tokenizer).expanduser()
    if tokenizer.exists() and not _inside(str(tokenizer.resolve()), mounts):
        source = str(tokenizer.resolve() if tokenizer.is_dir() else tokenizer.resolve().parent)
        mounts.append(Mount(source, source, True, "tokenizer"))
    cache = hf_cache()
    if cache.is_dir():
        mounts.append(Mount(str(cache), str(cache), False, "hf-cache"))
    user = [parse_mount(m) for m in run.recipe.launch.mounts]
    taken = {m.target for m in user}
    return [m for m in mounts if m.target not in taken] + user, pythonpath


def build_launch_plan(run: RunPlan) -> LaunchPlan:
    """The launch plan of `run` for its recipe's `launch.launcher` (set by `plan_run`)."""
    from zebra.train.launch import rank_command, torchrun_command

    spec = run.recipe.launch
    launcher = spec.launcher
    run_dir = run.run_dir.resolve()
    in_container = launcher == "docker" or (launcher == "slurm" and spec.container)
    python = spec.container_python if in_container else sys.executable
    one_rank = rank_command(run_dir, resume=run.resume, device=run.device, python=python)
    rdzv = run.rdzv_endpoint
    if launcher == "slurm" and spec.container:
        rdzv = "FIRST_NODE:PORT"  # filled in by each task from the job's node list and id
    if (run.world_size == 1 and launcher != "slurm") or (launcher == "slurm" and not spec.container):
        command = one_rank  # (on Slurm without a container: each task is one rank)
    else:
        command = torchrun_command(
            run_dir,
            nproc_per_node=run.procs_per_node,
            nnodes=run.nodes,
            rdzv_endpoint=rdzv,
            resume=run.resume,
            device=run.device,
            python=python,
        )
    plan = LaunchPlan(
        launcher=launcher,
        run_dir=run_dir,
        recipe=run.recipe.name,
        device=run.device,
        nodes=run.nodes,
        ranks_per_node=run.procs_per_node,
        resume=run.resume,
        env=passthrough(extra=spec.env),
        command=command,
        rank_command=one_rank,
        rdzv_endpoint=rdzv,
    )
    if in_container:
        from zebra.launch.container import container_spec

        plan.image = spec.image
        plan.mounts, pythonpath = container_mounts(run, run_dir)
        plan.container = container_spec(plan, spec, pythonpath)
    if launcher == "slurm":
        from zebra.launch.slurm import slurm_spec

        plan.slurm = slurm_spec(plan, spec)
    return plan
