"""Docker and Slurm checks against the real services: unreachable ones warn (fail when required)."""

from __future__ import annotations

import shutil

import pytest

from zebra.doctor import promote
from zebra.doctor.services import check_docker, check_slurm


def test_docker_unreachable_socket_warns_and_fails_when_required(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    check = check_docker()
    assert check.status == "warn"
    assert f"{tmp_path}/no-engine.sock" in check.detail
    assert "No such file or directory" in check.detail
    assert "dockerd" in check.fix and "DOCKER_HOST" in check.fix
    (required,) = promote([check], ["docker"])
    assert required.status == "fail"


def test_docker_refused_tcp_port_warns(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")  # discard port: nothing listens
    check = check_docker()
    assert check.status == "warn" and "Connection refused" in check.detail


@pytest.mark.infra
def test_docker_running_engine_is_ok(docker_client):
    check = check_docker()
    assert check.status == "ok", check.detail
    assert docker_client.version()["Version"] in check.detail


def test_slurm_without_sinfo_warns(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    check = check_slurm()
    assert check.status == "warn"
    assert "sinfo not found" in check.detail and "slurm-client" in check.fix
    assert promote([check], ["slurm"])[0].status == "fail"


@pytest.mark.infra
def test_slurm_controller_down_warns(monkeypatch, tmp_path):
    if not shutil.which("sinfo"):
        pytest.skip("needs the Slurm client (sinfo)")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nMessageTimeout=2\n"
        "AuthType=auth/munge\nNodeName=localhost CPUs=1 State=UNKNOWN\n"
        "PartitionName=debug Nodes=localhost Default=YES State=UP\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    check = check_slurm()
    assert check.status == "warn"
    assert check.detail.startswith("sinfo failed")
    assert "slurmctld" in check.fix


@pytest.mark.infra
def test_slurm_running_cluster_is_ok(slurm_cluster):
    check = check_slurm()
    assert check.status == "ok", check.detail
    assert slurm_cluster in check.detail
