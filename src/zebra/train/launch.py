"""Start a run's ranks on this machine through torch's elastic agent, and build rank commands for launchers.

Launchers (local, Docker, Slurm) share these pieces:
- `rank_command(run_dir)`: the argv of one rank (`python -m zebra.train.entry RUN_DIR ...`);
- `rank_env(...)`: the torchrun variables a rank reads when something other than torchrun starts it;
- `torchrun_command(run_dir, ...)`: the argv that starts every rank of one node (for a container);
- `launch_local(run_dir, ...)`: the same in this process, through `torch.distributed.launcher.api`.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from zebra.errors import ZebraError

ENTRY_MODULE = "zebra.train.entry"
SHUTDOWN_TIMEOUT_S = 600  # how long ranks get to save a checkpoint after a stop signal before SIGKILL


def rank_command(
    run_dir: str | Path, *, resume: str = "auto", device: str = "auto", python: str | None = None
) -> list[str]:
    """argv of one training rank."""
    return [
        python or sys.executable,
        "-m",
        ENTRY_MODULE,
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
        if not rdzv_endpoint:
            raise ZebraError(
                "a multi-node run needs a rendezvous endpoint", fix="pass --rdzv-endpoint HOST:PORT"
            )
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={run_id(run_dir)}"]
    return [*cmd, "-m", ENTRY_MODULE, str(run_dir), "--resume", resume, "--device", device]


def cpu_threads_per_rank(nproc_per_node: int) -> int:
    """CPU threads for each rank so that the ranks of a node do not oversubscribe its cores."""
    return max(1, (os.cpu_count() or 1) // nproc_per_node)


@dataclass
class LaunchOutcome:
    stopped_by: str | None  # the signal this launcher received (ranks saved and stopped), None when done


def launch_local(
    run_dir: str | Path,
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    resume: str = "auto",
    device: str = "auto",
) -> LaunchOutcome:
    """Start `nproc_per_node` ranks here (one node of `nnodes`) through the elastic agent and wait for them.

    Raises:
        ZebraError: a rank failed; its exit code becomes the error's.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nnodes > 1 and not rdzv_endpoint:
        raise ZebraError("a multi-node run needs a rendezvous endpoint", fix="pass --rdzv-endpoint HOST:PORT")
    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        run_id=run_id(run_dir),
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or "localhost:0",
        rdzv_configs={"timeout": 900},
        max_restarts=0,
        monitor_interval=0.5,
        logs_specs=DefaultLogsSpecs(),  # ranks write straight to this terminal
        signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    argv = rank_command(run_dir, resume=resume, device=device)
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", str(cpu_threads_per_rank(nproc_per_node)))
    try:
        elastic_launch(config, entrypoint=argv[0])(*argv[1:])
    except SignalException as e:
        return LaunchOutcome(stopped_by=e.sigval.name)
    except ChildFailedError as e:
        rank, failure = min(e.failures.items())
        raise ZebraError(
            f"training failed: rank {rank} exited with code {failure.exitcode}",
            fix="its error is printed above",
            exit_code=failure.exitcode if failure.exitcode > 0 else 1,
        ) from None
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return LaunchOutcome(stopped_by=None)
