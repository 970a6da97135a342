"""Launchers: one `LaunchPlan` per run, one entry that starts it, three ways its ranks run.

- `local` (`local.py`): this machine; one rank in this process, several through torch's elastic agent;
- `docker` (`container.py` the spec, `docker.py` the Docker SDK): one node's ranks in a container;
- `slurm` (`slurm_spec.py` the sbatch parameters, `slurm_submit.py` submitit, `slurm_task.py` what each task
  runs on its node): one task per rank, or one container per node. `jobs.py` keeps the submitted jobs.

Shared: `ranks.py` counts the ranks where they run, `commands.py` builds the rank and torchrun commands,
`environment.py` decides what the ranks get from this machine (variables, mounts, secrets), `devices.py` the
GPUs, `fields.py` refuses control characters in what reaches sbatch or a container.

    from zebra.launch import Callbacks, check_launcher, hold_run_dir, make_plan, start
    from zebra.recipes import load_recipe
    from zebra.train.run import prepare_run
    recipe = load_recipe("tiny", overrides=["launch.launcher=docker", "launch.image=zebra-test/hostbind"])
    plan = make_plan(recipe, nproc=2)      # plan.describe(): the dry-run view, secrets masked
    check_launcher(plan)
    with hold_run_dir(plan) as lock:       # RUN/.lock
        prepare_run(plan.run)
        outcome = start(plan, Callbacks(), lock=lock)   # outcome.stopped_by, outcome.job
"""

from zebra.launch.plan import LaunchPlan, launch_overrides, make_plan, with_launch_lists
from zebra.launch.start import Callbacks, Outcome, check_launcher, hold_run_dir, start

__all__ = [
    "Callbacks",
    "LaunchPlan",
    "Outcome",
    "check_launcher",
    "hold_run_dir",
    "launch_overrides",
    "make_plan",
    "start",
    "with_launch_lists",
]
