"""The launch plan: how the ranks of one run start, decided once and handed to `zebra.launch.start`.

`make_plan(recipe, ...)` counts the ranks where the recipe's `launch.launcher` runs them, resolves the run
(`zebra.train.run.TrainRun`: run directory, batch split, data, resume point) and decides how its ranks start:
the environment they get (secrets masked when shown), the command of one node's ranks and of one rank, plus
the container spec (docker, slurm with a container) or the sbatch parameters (slurm). `--dry-run` prints
`LaunchPlan.describe()`.

The flags of `zebra train` that set recipe keys become typed overrides before the recipe is loaded
(`launch_overrides`); the repeatable ones add to the recipe's lists (`with_launch_lists`).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebra.launch.commands import rank_command, torchrun_command
from zebra.launch.container import ContainerSpec, container_spec
from zebra.launch.environment import EnvVar, masked, passthrough
from zebra.launch.fields import check_fields
from zebra.launch.ranks import count_ranks
from zebra.launch.slurm_spec import Sinfo, SlurmSpec, check_partition_if_here, slurm_spec
from zebra.recipes import Recipe
from zebra.train.run import TrainRun, resolve_run

SLURM_RENDEZVOUS = "FIRST_NODE:PORT"  # each Slurm task fills it in from the job's node list and id


@dataclass
class LaunchPlan:
    """Everything a launcher needs to start the ranks of `run`.

    `command` is what starts one node's ranks (torchrun, or one rank's program when the node has one rank); on
    Slurm without a container each task runs `rank_command` instead. Paths are absolute.
    """

    launcher: str  # local | docker | slurm
    run: TrainRun
    run_dir: Path  # run.run_dir, absolute
    env: list[EnvVar]
    command: list[str]
    rank_command: list[str]
    rdzv_endpoint: str | None = None  # where torchrun's nodes meet (SLURM_RENDEZVOUS: found by each task)
    container: ContainerSpec | None = None
    slurm: SlurmSpec | None = None
    # sinfo's answers for this launch: the plan, check_launcher and the submission ask each query once
    sinfo: Sinfo = field(default_factory=Sinfo, repr=False, compare=False)

    @property
    def image(self) -> str | None:
        return self.container.image if self.container else None

    def describe(self) -> dict[str, Any]:
        """The complete plan as plain data, secret values masked (what `--dry-run` prints)."""
        ranks = self.run.ranks
        info: dict[str, Any] = {
            "launcher": self.launcher,
            "run_dir": str(self.run_dir),
            "device": ranks.device,
            "nodes": ranks.nodes,
            "ranks_per_node": ranks.ranks_per_node,
            "gpus_per_node": ranks.gpus_per_node,
            "world_size": ranks.world_size,
            "resume": self.run.resume,
            "command": shlex.join(self.command),
            "env": masked(self.env),
        }
        if "torch.distributed.run" in self.command:  # the torchrun arguments, up to the rank program
            info["torchrun"] = self.command[self.command.index("torch.distributed.run") + 1 :]
        if self.rdzv_endpoint:
            info["rdzv_endpoint"] = self.rdzv_endpoint
        if self.container is not None:
            info["container"] = self.container.describe()
        if self.slurm is not None:
            info["slurm"] = self.slurm.describe()
            info["rank_command"] = shlex.join(self.rank_command)
        return info


def launch_overrides(**settings: Any) -> dict[str, Any]:
    """Typed overrides of the recipe's launch section for the flags given (None: not given)."""
    return {f"launch.{key}": value for key, value in settings.items() if value is not None}


def with_launch_lists(
    recipe: Recipe,
    *,
    mounts: Sequence[str] = (),
    sbatch_extra: Sequence[str] = (),
    env: Sequence[str] = (),
    secret_env: Sequence[str] = (),
) -> Recipe:
    """A copy of `recipe` whose `launch.mounts`, `launch.sbatch_extra`, `launch.env` and `launch.secret_env`
    go on with these."""
    spec = recipe.launch
    launch = dataclasses.replace(
        spec,
        mounts=[*spec.mounts, *mounts],
        sbatch_extra=[*spec.sbatch_extra, *sbatch_extra],
        env=[*spec.env, *env],
        secret_env=[*spec.secret_env, *secret_env],
    )
    return dataclasses.replace(recipe, launch=launch)


def make_plan(
    recipe: Recipe,
    *,
    gpus: int | None = None,
    nproc: int | None = None,
    nodes: int | None = None,
    rdzv_endpoint: str | None = None,
    output: str | Path = "runs",
    run: str | None = None,
    resume: str = "auto",
    prepare_data: bool = True,
) -> LaunchPlan:
    """The plan of a run of `recipe` with its `launch.launcher` (a one-line ZebraError for any problem).

    `gpus` / `nproc` ranks per node and `nodes` default to the recipe's `launch` section; the run directory is
    `output/run` (default: the recipe's name); `resume` is auto, never or a checkpoint path. `prepare_data`
    False (`--dry-run`) writes nothing, not even the tokenized `@sample` (its would-be prefix is planned).
    """
    sinfo = Sinfo()
    ranks = count_ranks(
        recipe.launch, gpus=gpus, nproc=nproc, nodes=nodes, rdzv_endpoint=rdzv_endpoint, sinfo=sinfo
    )
    resolved = resolve_run(recipe, ranks, output=output, run=run, resume=resume, prepare_data=prepare_data)
    return _plan_launch(resolved, sinfo)


def _plan_launch(run: TrainRun, sinfo: Sinfo) -> LaunchPlan:
    """How the ranks of `run` start with its recipe's `launch.launcher`."""
    spec, ranks = run.recipe.launch, run.ranks
    launcher = spec.launcher
    run_dir = run.run_dir.resolve()
    in_container = launcher == "docker" or (launcher == "slurm" and spec.container)
    python = spec.container_python if in_container else sys.executable
    one_rank = rank_command(run_dir, resume=run.resume, device=ranks.device, python=python)
    rdzv = SLURM_RENDEZVOUS if launcher == "slurm" and spec.container else ranks.rdzv_endpoint
    if (ranks.world_size == 1 and launcher != "slurm") or (launcher == "slurm" and not spec.container):
        command = one_rank  # (on Slurm without a container: each task is one rank)
    else:
        command = torchrun_command(
            run_dir,
            nproc_per_node=ranks.ranks_per_node,
            nnodes=ranks.nodes,
            rdzv_endpoint=rdzv,
            resume=run.resume,
            device=ranks.device,
            python=python,
        )
    env = passthrough(extra=spec.env, secret=spec.secret_env)
    if launcher != "local":  # what reaches sbatch or a container spec stays on its line
        check_fields(run, env)
    if launcher == "slurm":  # also in --dry-run, where a Slurm client answers here
        check_partition_if_here(spec.partition, sinfo)
    return LaunchPlan(
        launcher=launcher,
        run=run,
        run_dir=run_dir,
        env=env,
        command=command,
        rank_command=one_rank,
        rdzv_endpoint=rdzv,
        container=container_spec(run, command=command, env=env) if in_container else None,
        slurm=slurm_spec(run) if launcher == "slurm" else None,
        sinfo=sinfo,
    )
