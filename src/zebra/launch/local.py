"""The local launcher: a run's ranks on this machine. One rank trains in this process; several start through
torch's elastic agent (torchrun's launcher API), each running `python -m zebra.cli.rank RUN_DIR`, their
output going straight to this terminal.
"""

from __future__ import annotations

import os
from pathlib import Path

from zebra.core.caches import without_torch_writes
from zebra.core.errors import ZebraError
from zebra.launch.commands import cpu_threads_per_rank, rank_command, require_rendezvous, run_id
from zebra.train.run import TrainRun
from zebra.train.view import TrainView

SHUTDOWN_TIMEOUT_S = 600  # how long ranks get to save a checkpoint after a stop signal before SIGKILL
RDZV_TIMEOUT_S = 900  # how long the nodes of a run have to join its rendezvous
RESTART_FIX = "restart every node with the same command: --resume auto continues from the last checkpoint"


def run_local(run: TrainRun, view: TrainView | None = None) -> str | None:
    """Train `run` here to its end; the signal that stopped it early (the ranks saved), or None.

    Raises:
        ZebraError: the run failed (a rank's exit code becomes the error's).
    """
    ranks = run.ranks
    if ranks.world_size == 1:
        # torch and the model library: imported when a one-rank run starts, not when zebra.launch loads
        from zebra.train.trainer import train_rank

        return train_rank(run.run_dir, resume=run.resume, device=ranks.device, view=view).stopped_by
    return launch_local(
        run.run_dir,
        nproc_per_node=ranks.ranks_per_node,
        nnodes=ranks.nodes,
        rdzv_endpoint=ranks.rdzv_endpoint,
        resume=run.resume,
        device=ranks.device,
    )


def launch_local(
    run_dir: str | Path,
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    resume: str = "auto",
    device: str = "auto",
) -> str | None:
    """Start `nproc_per_node` ranks here (one node of `nnodes`) through the elastic agent and wait for them;
    the signal that stopped them early (they saved), or None.

    Raises:
        ZebraError: a rank failed; its exit code becomes the error's.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    require_rendezvous(nnodes, rdzv_endpoint)
    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        run_id=run_id(run_dir),
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or "localhost:0",
        rdzv_configs={"timeout": RDZV_TIMEOUT_S},
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
        with without_torch_writes():  # the ranks inherit this environment, less torch's own defaults
            elastic_launch(config, entrypoint=argv[0])(*argv[1:])
    except SignalException as e:
        return e.sigval.name
    except ChildFailedError as e:
        rank, failure = min(e.failures.items())
        raise ZebraError(
            f"training failed: rank {rank} exited with code {failure.exitcode}",
            fix="its error is printed above",
            exit_code=failure.exitcode if failure.exitcode > 0 else 1,
        ) from None
    except RendezvousError as e:
        raise rendezvous_error(e, rdzv_endpoint or "this machine", nnodes) from None
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return None


def rendezvous_error(error: Exception, endpoint: str, nnodes: int) -> ZebraError:
    """The elastic agent lost its rendezvous (the node hosting it died) or the nodes never all joined."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

    if isinstance(error, RendezvousConnectionError):
        return ZebraError(
            f"lost the node hosting the rendezvous at {endpoint}: it stopped or cannot be reached",
            fix=RESTART_FIX,
        )
    if isinstance(error, RendezvousTimeoutError):
        return ZebraError(
            f"the rendezvous at {endpoint} timed out: not all {nnodes} nodes joined within {RDZV_TIMEOUT_S} s",
            fix="start the same command, with the same --rdzv-endpoint, on every node",
        )
    cause = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return ZebraError(f"the rendezvous at {endpoint} failed: {cause}", fix=RESTART_FIX)
