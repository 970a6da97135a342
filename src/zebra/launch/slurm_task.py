"""What each task of a run's Slurm job runs (pickled by submitit into the run's `slurm/` folder): one rank, or
one node's container.

A task takes its place in the job from Slurm (`submitit.helpers.TorchDistributedEnvironment`), starts the rank
program `python -m zebra.cli.rank RUN_DIR` (or the node's container running torchrun) and waits for it.

Pre-emption and time limits: sbatch asks Slurm for USR2 `SIGNAL_DELAY_S` before the limit; submitit calls
`SlurmTask.checkpoint()` in task 0, which stops the ranks with SIGTERM (the trainer saves a checkpoint and
exits 0) and hands back the same task with `--resume auto`; submitit then requeues the job. A job that Slurm
itself requeues (pre-emption, `scontrol requeue`) restarts with SLURM_RESTART_COUNT > 0 and also resumes.
Each task writes its rank's exit code to `slurm/<job>_<task>_exit.json`, which `zebra jobs` reads when
accounting (sacct) is not there. Task 0 holds the run directory's lock (`RUN/.lock`) while the job runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from zebra.core.errors import ZebraError
from zebra.launch.commands import rank_command, rank_env, torchrun_command
from zebra.launch.container import ContainerSpec
from zebra.launch.docker import start_container, stop_and_wait
from zebra.launch.jobs import exit_file
from zebra.train.run import run_lock

POLL_S = 0.5


@dataclass
class SlurmTask:
    """What each Slurm task runs (pickled by submitit): one rank, or one node's container."""

    run_dir: str
    resume: str
    device: str
    ranks_per_node: int
    container: ContainerSpec | None = None

    def __call__(self) -> int:
        import submitit

        job = submitit.JobEnvironment()
        dist = submitit.helpers.TorchDistributedEnvironment()
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        resume = "auto" if restarts else self.resume
        done = exit_file(job.paths.folder, job.job_id, job.global_rank)
        done.unlink(missing_ok=True)
        print(
            f"zebra: task {job.global_rank} of job {job.job_id} on {job.hostname} (restart {restarts})",
            flush=True,
        )
        with self._run_lock(job, done):
            if self.container is None:
                code = self._run_rank(dist, resume)
            else:
                code = self._run_container(job, dist, resume)
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps({"exit_code": code, "task": job.global_rank, "restarts": restarts}))
        tmp.replace(done)
        if code:
            sys.exit(code)  # the task (and the job) fails with the rank's code
        return code

    def _run_lock(self, job, done: Path) -> contextlib.AbstractContextManager:
        """Task 0 holds the run directory's lock while the job runs (a requeued attempt waits for its earlier
        one). When another run holds it the job is cancelled: the other tasks' ranks would wait for rank 0."""
        if job.global_rank != 0:
            return contextlib.nullcontext()
        try:
            return run_lock(self.run_dir).acquire()
        except ZebraError as e:
            print(f"zebra: error: {e}", flush=True)
            done.write_text(json.dumps({"exit_code": 1, "task": job.global_rank, "error": e.message}))
            subprocess.run(["scancel", job.job_id], check=False)
            sys.exit(1)

    def _run_rank(self, dist, resume: str) -> int:
        import submitit

        threads = int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0) or None
        env = {
            **os.environ,
            **rank_env(
                rank=dist.rank,
                local_rank=dist.local_rank,
                world_size=dist.world_size,
                local_world_size=dist.local_world_size,
                master_addr=dist.master_addr,
                master_port=dist.master_port,
                threads=threads,
            ),
            "PYTHONUNBUFFERED": "1",
        }
        # Slurm delivers submitit's requeue signal (USR2) to every process of the step: the rank ignores it,
        # this task's checkpoint() stops the rank with SIGTERM instead.
        requeue_signal = getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)
        child = subprocess.Popen(
            rank_command(self.run_dir, resume=resume, device=self.device),
            env=env,
            preexec_fn=lambda: signal.signal(requeue_signal, signal.SIG_IGN),
        )
        exit_codes: list[int] = []
        # Popen.wait holds a lock that a signal handler's wait would deadlock on: wait in a thread, poll here.
        threading.Thread(target=lambda: exit_codes.append(child.wait()), daemon=True).start()

        def wait() -> int:
            while not exit_codes:
                time.sleep(POLL_S)
            return exit_codes[0]

        self._stop = lambda: child.send_signal(signal.SIGTERM)
        self._wait = wait
        return wait()

    def _run_container(self, job, dist, resume: str) -> int:
        spec = self.container
        command = torchrun_command(
            self.run_dir,
            nproc_per_node=self.ranks_per_node,
            nnodes=job.num_nodes,
            rdzv_endpoint=f"{dist.master_addr}:{dist.master_port}",
            resume=resume,
            device=self.device,
            python=spec.python,
        )
        name = f"zebra-{job.job_id}-node{job.node}"
        node_spec = replace(
            spec, command=command, name=name, labels={**spec.labels, "zebra.slurm_job": job.job_id}
        )
        running = start_container(node_spec, log=lambda m: print(m, flush=True))
        stop_requested: list[int] = []
        # Slurm signals this task's processes, not the container's: forward SIGTERM (the ranks save).
        signal.signal(signal.SIGTERM, lambda signum, _frame: stop_requested.append(signum))
        self._stop = lambda: None
        self._wait = lambda: stop_and_wait(name)
        try:
            forwarded = False
            while not running.exited():
                if stop_requested and not forwarded:
                    running.signal("SIGTERM")
                    forwarded = True
                time.sleep(POLL_S)
            return running.exit_code()
        finally:
            running.remove()

    def checkpoint(self):
        """Called by submitit in task 0 on USR2 (pre-emption, time limit): stop the ranks so that they save,
        and return the task to requeue, resuming from that checkpoint."""
        import submitit

        stop, wait = getattr(self, "_stop", None), getattr(self, "_wait", None)
        if stop is not None:
            print(
                "zebra: pre-empted or near the time limit: saving a checkpoint before the requeue", flush=True
            )
            stop()
            wait()
        return submitit.helpers.DelayedSubmission(replace(self, resume="auto"))
