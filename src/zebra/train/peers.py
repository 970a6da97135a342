"""Which node a rank lost: when a collective fails because a peer died (a node killed, its network gone), the
surviving ranks stop with one line naming the node instead of the backend's traceback.

Every rank of a multi-rank run listens on a TCP port of its own (on the address that reaches the rendezvous,
nothing wider) and, once at start, tells the others where, with its node and host. After a failure a rank
knocks on every peer's port: a peer whose port refuses, or does not answer within `PROBE_TIMEOUT_S`, is gone.
A live peer answers even while it is blocked in a collective (a daemon thread accepts and closes).

    with watch_peers(env, run_dir):
        trainer.fit()       # a failure with a peer gone becomes ZebraError("lost node 1 (host): ...")
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from zebra.core.errors import ZebraError
from zebra.folders.checkpoint_dir import committed, newest_step
from zebra.train.dist import DistEnv

PROBE_TIMEOUT_S = 5.0  # a peer on a live host answers in milliseconds; a dead host never does


@dataclass(frozen=True)
class Peer:
    """Where one rank runs and listens."""

    rank: int
    node: int  # the node's rank in the job (torchrun's GROUP_RANK, Slurm's SLURM_NODEID)
    host: str
    address: str
    port: int


def node_rank(env: DistEnv) -> int:
    """This rank's node: torchrun's GROUP_RANK, Slurm's SLURM_NODEID, else counted from LOCAL_WORLD_SIZE."""
    for name in ("GROUP_RANK", "SLURM_NODEID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return env.rank // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def reachable_address() -> tuple[int, str]:
    """(family, local address) of the interface this host reaches the rendezvous (MASTER_ADDR) through."""
    master = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = int(os.environ.get("MASTER_PORT") or 29500)
    family, _, _, _, target = socket.getaddrinfo(master, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)  # UDP: picks the route, sends nothing
        return family, probe.getsockname()[0]


class PeerWatch:
    """This rank's listening port, and every rank's `Peer` (exchanged once through the process group)."""

    def __init__(self, env: DistEnv):
        import torch.distributed as dist

        family, address = reachable_address()
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.bind((address, 0))
        self._listener.listen(128)
        threading.Thread(target=self._answer, daemon=True).start()
        me = Peer(env.rank, node_rank(env), socket.gethostname(), address, self._listener.getsockname()[1])
        table: list[Peer | None] = [None] * env.world_size
        dist.all_gather_object(table, me)
        self.rank = env.rank
        self.peers: list[Peer] = [p for p in table if p is not None]

    def _answer(self) -> None:
        with contextlib.suppress(OSError):  # the listener was closed
            while True:
                conn, _ = self._listener.accept()
                conn.close()

    def lost(self) -> list[Peer]:
        """The peers that no longer answer (probed in parallel)."""
        others = [p for p in self.peers if p.rank != self.rank]
        if not others:
            return []
        with ThreadPoolExecutor(max_workers=min(64, len(others))) as pool:
            alive = list(pool.map(_answers, others))
        return [peer for peer, ok in zip(others, alive, strict=True) if not ok]

    def close(self) -> None:
        self._listener.close()


def _answers(peer: Peer) -> bool:
    try:
        socket.create_connection((peer.address, peer.port), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def describe_lost(lost: list[Peer]) -> str:
    """`node 1 (host-b: rank 1)`, one entry per node."""
    nodes: dict[int, list[Peer]] = {}
    for peer in lost:
        nodes.setdefault(peer.node, []).append(peer)
    parts = []
    for node, peers in sorted(nodes.items()):
        ranks = ", ".join(str(p.rank) for p in peers)
        parts.append(f"node {node} ({peers[0].host}: rank{'s' if len(peers) > 1 else ''} {ranks})")
    return " and ".join(parts)


def short_cause(error: BaseException) -> str:
    """The first sentence of a backend's error, without its source location: `Connection closed by peer ...`."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    first = re.sub(r"^\[[^\]]*\]\s*", "", first)  # gloo's `[/path/pair.cc:553] `
    return first.split(". ")[0][:160]


def lost_nodes_error(lost: list[Peer], error: BaseException, run_dir: Path) -> ZebraError:
    step = newest_step(committed(run_dir / "checkpoints"))  # a torn meta.json: the one a resume would read
    where = f"step {step}" if step is not None else "the start (no checkpoint yet)"
    return ZebraError(
        f"lost {describe_lost(lost)}: it stopped answering ({short_cause(error)})",
        fix=f"restart every node with the same command: --resume auto continues from {where}",
    )


@contextlib.contextmanager
def watch_peers(env: DistEnv, run_dir: Path) -> Iterator[None]:
    """Turn a failure of the block into a one-line ZebraError naming the lost nodes, when peers are gone."""
    if not env.distributed:
        yield
        return
    watch = PeerWatch(env)
    try:
        yield
    except (ZebraError, KeyboardInterrupt):
        raise
    except Exception as e:
        lost = watch.lost()
        if lost:
            raise lost_nodes_error(lost, e, run_dir) from None
        raise
    finally:
        watch.close()
