"""Launcher mistakes and missing services end in one line (plus a hint), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_results import assert_one_line_error

from .helpers import TINY, recording


def one_line_error(result, *needles: str) -> str:
    """`assert_one_line_error` with every needle in the error line itself, and a hint."""
    error = assert_one_line_error(result)
    for needle in needles:
        assert needle in error, error
    assert "hint:" in result.stderr
    return error


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--launcher", "slurm"], ["--launcher slurm", "ranks per node"]),
        (["--launcher", "slurm", "--nproc", "2", "--time", "25h"], ["--time", "25h"]),
        (["--launcher", "slurm", "--nproc", "2", "--sbatch-extra=--nodes=3"], ["--sbatch-extra", "--nodes"]),
        (
            ["--launcher", "slurm", "--nproc", "2", "--sbatch-extra=exclusive"],
            ["--sbatch-extra", "exclusive"],
        ),
        (["--launcher", "slurm", "--nproc", "2", "--rdzv-endpoint", "h:1"], ["--rdzv-endpoint"]),
        (["--launcher", "docker", "--nodes", "2"], ["--nodes 2", "rendezvous"]),
        (["--launcher", "docker", "--mount", "/no/such/dir:/data"], ["--mount", "/no/such/dir"]),
        (["--launcher", "docker", "--mount", "a:b:c:d"], ["--mount", "HOST[:CONTAINER][:ro]"]),
    ],
)
def test_bad_launcher_flags(cli, tmp_path, flags, needles):
    one_line_error(cli("train", *TINY, *flags, "--dry-run", "-o", str(tmp_path)), *needles)


SLURM = ["--launcher", "slurm", "--nproc", "2"]
DOCKER = ["--launcher", "docker"]


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        ([*SLURM, "--account", "proj\necho owned"], "launch.account (--account)"),
        ([*SLURM, "--partition", "de\rbug"], "launch.partition (--partition)"),
        ([*SLURM, "--qos", "high\x1b[2J"], "launch.qos (--qos)"),
        ([*SLURM, "--time", "10\n:00"], "launch.time (--time)"),
        ([*SLURM, "--sbatch-extra=--comment=a\nrm -rf ~"], "launch.sbatch_extra (--sbatch-extra)"),
        ([*SLURM, "--run", "tiny\nid"], "a run name is one folder name"),
        ([*SLURM, "--set", "launch.account=a\tb"], "launch.account (--account)"),
        ([*DOCKER, "--image", "busybox\nx"], "launch.image (--image)"),
        ([*DOCKER, "--mount", "/tmp:/da\nta"], "launch.mounts (--mount)"),
        ([*DOCKER, "--env", "NAME\nX"], "launch.env (--env)"),
        ([*DOCKER, "--secret-env", "DB\0PASS"], "launch.secret_env (--secret-env)"),
        ([*DOCKER, "--set", "launch.container_setup=pip install x\nrm -rf /"], "launch.container_setup"),
        ([*DOCKER, "--set", "launch.shm_size=8\ng"], "launch.shm_size"),
    ],
)
def test_control_characters_never_reach_sbatch_or_a_container(cli, tmp_path, flags, key):
    """A newline in a shared recipe's `launch.account` would become a line of the batch script."""
    line = one_line_error(
        cli("train", *TINY, *flags, "--dry-run", "-o", str(tmp_path)), key, "control character"
    )
    assert not (tmp_path / "tiny").exists()
    assert line.count("\n") == 0  # shown escaped, on one line


def test_a_control_character_in_a_passed_variable_is_refused_without_showing_it(cli, tmp_path):
    secret = "hf_line1\nline2"
    result = cli("train", *TINY, *DOCKER, "--dry-run", "-o", str(tmp_path), env={"HF_TOKEN": secret})
    one_line_error(result, "environment variable HF_TOKEN", "control character")
    assert "hf_line1" not in result.output


def test_no_docker_engine(cli, tmp_path):
    sock = tmp_path / "no-docker.sock"
    result = cli(
        "train", *TINY, "--launcher", "docker", "-o", str(tmp_path), env={"DOCKER_HOST": f"unix://{sock}"}
    )
    one_line_error(result, "no Docker engine reachable", str(sock))
    assert "DOCKER_HOST" in result.stderr
    assert not (tmp_path / "tiny").exists()  # nothing written before the launcher could start


def test_no_slurm_client(cli, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = cli(
        "train", *TINY, "--launcher", "slurm", "--nproc", "2", "-o", str(tmp_path), env={"PATH": str(empty)}
    )
    one_line_error(result, "--launcher slurm", "sbatch")
    assert not (tmp_path / "tiny").exists()


@pytest.mark.infra
def test_missing_image(cli, tmp_path, docker_client):
    result = cli(
        "train", *TINY, "--launcher", "docker", "--image", "zebra-test/no-such-image:1", "-o", str(tmp_path)
    )
    one_line_error(result, "zebra-test/no-such-image:1", "pulling it failed")
    assert "docker pull" in result.stderr
    assert not (tmp_path / "tiny").exists()


@pytest.mark.infra
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_partition_the_cluster_lacks_is_refused_before_anything_is_written(
    cli, tmp_path, slurm_cluster, dry_run
):
    result = cli("train", *TINY, *SLURM, "--partition", "nosuch", *dry_run, "-o", str(tmp_path / "runs"))
    one_line_error(result, "--partition nosuch", "no such partition", slurm_cluster)
    assert not (tmp_path / "runs").exists()


@pytest.mark.infra
def test_slurm_without_gpus_or_nproc_sees_the_nodes(cli, tmp_path, slurm_cluster):
    """The test cluster's nodes have no GPUs: zebra asks sinfo and says so, rather than that it cannot see them."""
    result = cli(
        "train", *TINY, "--launcher", "slurm", "--partition", slurm_cluster, "--dry-run", "-o", str(tmp_path)
    )
    one_line_error(result, "ranks per node", f"partition {slurm_cluster} has", "node(s) with no GPU(s)")
    assert "--nproc N" in result.stderr and "not visible" not in result.stderr


def dead_controller(tmp_path) -> str:
    """A copy of this cluster's slurm.conf whose controller port nothing listens on: a controller that does not
    answer (sinfo retries for about 9 s, then fails)."""
    import re
    import socket
    import subprocess

    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    conf = re.search(r"^SLURM_CONF\s*=\s*(\S+)", shown, re.M).group(1)
    with socket.socket() as s:  # a port free now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = re.sub(r"(?im)^SlurmctldPort=.*$", "", Path(conf).read_text()) + f"\nSlurmctldPort={port}\n"
    (tmp_path / "slurm.conf").write_text(text)
    return str(tmp_path / "slurm.conf")


@pytest.mark.infra
def test_a_controller_that_does_not_answer_is_reported_before_anything_is_written(
    cli, tmp_path, slurm_cluster
):
    """The plan lets sinfo's failure pass (a plan may be for a cluster elsewhere); the launcher's own check
    reports it, from the same one sinfo call (a second would wait as long again)."""
    env, calls = recording(tmp_path, "sinfo")
    env["SLURM_CONF"] = dead_controller(tmp_path)
    runs = tmp_path / "runs"
    result = cli("train", *TINY, *SLURM, "--partition", slurm_cluster, "-o", str(runs), env=env)
    one_line_error(result, "sinfo failed", "Unable to contact slurm controller")
    assert "login node" in result.stderr and not runs.exists()
    assert calls("sinfo") == ["--all -h -o %P %l"]
    planned = cli("train", *TINY, *SLURM, "--partition", slurm_cluster, "--dry-run", "-o", str(runs), env=env)
    assert planned.exit_code == 0, planned.output
    assert calls("sinfo") == ["--all -h -o %P %l"] * 2 and not runs.exists()  # one more plan, one more call
