"""Two torchrun nodes on this machine: two `zebra train --nodes 2 --nproc 1 --rdzv-endpoint 127.0.0.1:PORT`
processes (CPU ranks, gloo) meet at one c10d rendezvous and train exactly like one process with two ranks,
with DDP and with FSDP2; an FSDP2 checkpoint of 2 nodes x 1 rank resumes on 1 x 2 and 1 x 1 (DCP reshards);
a node killed with SIGKILL stops the other with one line naming it, and both restarted resume from the last
checkpoint."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zebra.train.checkpoint import committed, read_meta

from .helpers import SETS, losses

pytestmark = pytest.mark.infra

STEPS = 20
SETTINGS = [*SETS, "train.keep_last=100"]  # keep step 4 to reshard from
FLAGS = ["tiny", "--mock-data", "--max-steps", str(STEPS), *(a for s in SETTINGS for a in ("--set", s))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def wait_for(condition, what: str, procs=(), timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.poll() is not None:
                _, out, err = Nodes.result(proc)
                pytest.fail(
                    f"a node ended early ({proc.returncode}) waiting for {what}:\n{out[-2000:]}\n{err[-3000:]}"
                )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Nodes:
    """`count` zebra processes standing in for the nodes of one run, meeting at 127.0.0.1:`port`."""

    def __init__(self, env: dict[str, str], output: Path, *extra: str):
        self.env, self.output, self.extra = env, output, extra
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []

    def start(self) -> list[subprocess.Popen]:
        """Start both nodes (the first one hosts the rendezvous); their output goes to files."""
        for node in range(2):
            cmd = [sys.executable, "-m", "zebra.cli.main", "train", *FLAGS, *self.extra, "--nodes", "2",
                   "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{self.port}", "-o", str(self.output)]  # fmt: skip
            log = self.output / f"node{len(self.procs)}"
            with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True,
                                        env=self.env, start_new_session=True)  # fmt: skip
            proc.log = log
            self.procs.append(proc)
            if node == 0:  # let it bind the rendezvous port before the second node comes
                wait_for(lambda: listening(self.port), "the rendezvous", [proc])
        return self.procs[-2:]

    @staticmethod
    def result(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of a node once it ends."""
        code = proc.wait(timeout)
        return code, Path(f"{proc.log}.out").read_text(), Path(f"{proc.log}.err").read_text()

    def finish(self) -> list[tuple[int, str, str]]:
        return [self.result(p) for p in self.procs[-2:]]

    def kill_all(self) -> None:
        for proc in self.procs:
            kill_tree(proc.pid)


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (the ranks run in sessions of their own)."""
    for child in children(pid):
        kill_tree(child)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.fixture
def nodes(zebra_env, tmp_path):
    made: list[Nodes] = []

    def make(*extra: str, output: Path | None = None) -> Nodes:
        made.append(Nodes(zebra_env, output or tmp_path, *extra))
        return made[-1]

    yield make
    for group in made:
        group.kill_all()


@pytest.fixture(scope="module")
def one_node(tmp_path_factory) -> dict[str, list[tuple[int, float]]]:
    """The reference: one process with two ranks (`--nproc 2`), with DDP and with FSDP2."""
    from typer.testing import CliRunner

    from zebra.cli.main import app

    out = tmp_path_factory.mktemp("one-node")
    reference = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEBRA_TENSORBOARD", "0")
        for parallel in ("ddp", "fsdp"):
            args = ["train", *FLAGS, "--nproc", "2", "--set", f"train.parallel={parallel}", "-o", str(out),
                    "--run", parallel]  # fmt: skip
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, result.output
            reference[parallel] = losses(out / parallel)
    return reference


def assert_same_losses(got, reference, steps=range(1, STEPS + 1)) -> None:
    got = dict(got)
    assert sorted(got) == list(steps)
    for step in steps:
        assert got[step] == pytest.approx(dict(reference)[step], rel=1e-5), step


def assert_finished_like_one_process(run: Path, reference, parallel: str) -> None:
    """RUN (2 nodes x 1 rank) ended at its last step with a checkpoint of world size 2, and its losses are the
    one-process-two-ranks reference's."""
    final = run / "checkpoints" / f"step_{STEPS:07d}"
    assert committed(run / "checkpoints")[0] == final
    assert (read_meta(final)["world_size"], read_meta(final)["parallel"]) == (2, parallel)
    assert_same_losses(losses(run), reference)


def test_two_fsdp_nodes_train_like_one_process_with_two_ranks(nodes, one_node, tmp_path):
    """FSDP2 here; DDP's two nodes are the killed-node test's (its run, killed and resumed, ends the same)."""
    group = nodes("--set", "train.parallel=fsdp")
    group.start()
    for code, out, err in group.finish():
        assert code == 0, out + err
    run = tmp_path / "tiny"
    assert_finished_like_one_process(run, one_node["fsdp"], "fsdp")
    assert_reshards(run, tmp_path, one_node["fsdp"])


def assert_reshards(run: Path, tmp_path: Path, reference) -> None:
    """The 2 x 1 FSDP2 checkpoint of step 4 continues on 1 node x 2 ranks and on 1 x 1, as the run did."""
    from typer.testing import CliRunner

    from zebra.cli.main import app

    middle = run / "checkpoints" / "step_0000004"
    assert sorted(p.name for p in middle.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    for name, ranks in (("one-by-two", "2"), ("one-by-one", "1")):
        args = ["train", *FLAGS, "--nproc", ranks, "--set", "train.parallel=fsdp", "--resume", str(middle),
                "-o", str(tmp_path), "--run", name]  # fmt: skip
        result = CliRunner().invoke(app, args, env={"ZEBRA_TENSORBOARD": "0"})
        assert result.exit_code == 0, result.output
        # metrics.jsonl starts at step 5 (it resumed from step 4) and goes on as the 2 x 1 run did
        assert_same_losses(losses(tmp_path / name), reference, steps=range(5, STEPS + 1))


def test_a_killed_node_stops_the_other_which_names_it_and_both_resume(nodes, one_node, tmp_path):
    group = nodes()
    first, second = group.start()
    run = tmp_path / "tiny"
    wait_for(lambda: (run / "checkpoints" / "latest").is_file(), "the first checkpoint", [first, second])
    (rank,) = children(second.pid)  # the second node's one rank
    lost = environ_of(rank)["GROUP_RANK"]
    kill_tree(second.pid)

    code, out, err = Nodes.result(first, timeout=300)  # not hung: stopped by the lost peer
    assert code == 1, out + err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if "lost node" in x]
    assert f"lost node {lost} (" in line and "stopped answering" in line
    saved = read_meta(committed(run / "checkpoints")[0])["step"]
    assert saved < STEPS and f"continues from step {saved}" in err

    group.start()  # the same command on both nodes again
    results = group.finish()
    for code, out, err in results:
        assert code == 0, out + err
    log = "".join(out for _, out, _ in results)
    assert f"resumed from {run / 'checkpoints' / f'step_{saved:07d}'}" in log  # nothing lost beyond it
    # metrics.jsonl holds each step once, as if never killed: two DDP nodes train like one process with two ranks
    assert_finished_like_one_process(run, one_node["ddp"], "ddp")


def test_killing_the_node_that_hosts_the_rendezvous_stops_the_other_with_one_line(nodes, tmp_path):
    group = nodes()
    first, second = group.start()
    wait_for(
        lambda: (tmp_path / "tiny" / "checkpoints" / "latest").is_file(),
        "the first checkpoint",
        [first, second],
    )
    kill_tree(first.pid)

    code, out, err = Nodes.result(second, timeout=300)
    assert code == 1, out + err
    assert "Traceback" not in err
    # The rank sees its peer gone, the agent its rendezvous: whichever notices first, the node is named.
    assert f"lost the node hosting the rendezvous at 127.0.0.1:{group.port}" in err or "lost node 0 (" in err
