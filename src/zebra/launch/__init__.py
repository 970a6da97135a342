"""Launchers: one `LaunchPlan` per run, three ways to start its ranks.

- `local`: this machine, through torch's elastic agent (`zebra.train.launch.launch_local`);
- `docker`: one node's ranks in a container, through the Docker SDK (`zebra.launch.container`);
- `slurm`: a Slurm job through submitit, one task per rank or one container per node (`zebra.launch.slurm`).

from zebra.launch import plan_run, build_launch_plan
run = plan_run("tiny", launcher="docker", overrides=["launch.image=zebra-test/hostbind"], mock_data=True)
plan = build_launch_plan(run)      # plan.describe(): the dry-run view, secrets masked
"""

from zebra.launch.plan import LAUNCHERS, LaunchPlan, Mount, build_launch_plan, launch_overrides, plan_run

__all__ = ["LAUNCHERS", "LaunchPlan", "Mount", "build_launch_plan", "launch_overrides", "plan_run"]
