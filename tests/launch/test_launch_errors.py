"""Launcher mistakes and missing services end in one line (plus a hint), never a traceback."""

from __future__ import annotations

import pytest

from .helpers import TINY


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert "hint:" in result.stderr
    return errors[0]


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
