"""The docker launcher against a real Docker engine and the locally built test image (host /usr, /etc and
Python bound read-only): a tiny CPU run trains in a container, a failing run's exit code comes back, and an
interrupt stops, saves and removes the container."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from .helpers import STEPS, TINY, hostbind_flags, losses

pytestmark = pytest.mark.infra

SECRET = "hf_containerSecret_0123456789"


def containers_of(client, run_dir) -> list:
    return client.containers.list(all=True, filters={"label": f"zebra.run_dir={run_dir}"})


def test_tiny_run_trains_in_a_container_and_leaves_its_checkpoint_on_the_host(
    zebra, hostbind_image, docker_client, tmp_path
):
    # The setup line proves the token reaches the container without printing it.
    probe = 'test -n "$HF_TOKEN" && test "$HF_TOKEN" = "$EXPECTED_TOKEN" && echo token-arrived'
    result = zebra(
        "train", *TINY, "--launcher", "docker", *hostbind_flags(hostbind_image), "-o", str(tmp_path),
        "--env", "EXPECTED_TOKEN", "--set", f"launch.container_setup={probe}",
        env={"HF_TOKEN": SECRET, "EXPECTED_TOKEN": SECRET},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "tiny"
    final = f"step_{STEPS:07d}"
    assert (run_dir / "checkpoints" / final).is_dir()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == final
    assert [step for step, _ in losses(run_dir)] == list(range(1, STEPS + 1))
    assert f"step {STEPS}/{STEPS}" in result.stdout  # the container's output streamed here
    assert "token-arrived" in result.stdout and SECRET not in result.stdout + result.stderr
    assert [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()] == []
    assert not containers_of(docker_client, run_dir)


def test_a_failing_run_returns_its_exit_code(zebra, hostbind_image, docker_client, tmp_path):
    empty = tmp_path / "tiny" / "not-a-checkpoint"
    empty.mkdir(parents=True)  # inside the run directory, so the container sees it too
    result = zebra(
        "train",
        *TINY,
        "--launcher",
        "docker",
        *hostbind_flags(hostbind_image),
        "-o",
        str(tmp_path),
        "--resume",
        str(empty),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no checkpoint there" in result.stdout + result.stderr  # the rank's own error, streamed
    assert "failed with exit code 1" in result.stderr
    assert not containers_of(docker_client, tmp_path / "tiny")


def test_interrupt_saves_and_removes_the_container(zebra_env, hostbind_image, docker_client, tmp_path):
    args = [*TINY, "--max-steps", "1000", "--set", "train.save_interval=0"]
    cmd = [
        sys.executable,
        "-m",
        "zebra.cli.main",
        "train",
        *args,
        "--launcher",
        "docker",
        *hostbind_flags(hostbind_image),
        "-o",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=zebra_env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    run_dir = tmp_path / "tiny"
    try:
        deadline = time.monotonic() + 300
        while not any("step 2/1000" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
        assert len(containers_of(docker_client, run_dir)) == 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=300) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    output = "".join(lines)
    assert "stopped by SIGINT" in output
    assert not containers_of(docker_client, run_dir)
    saved = (run_dir / "checkpoints" / "latest").read_text().strip()  # saved on the forwarded SIGTERM
    assert int(saved.rsplit("_", 1)[1]) >= 2


def test_a_distillation_run_reads_its_teacher_and_init_export_through_the_mounts(
    zebra, hostbind_image, docker_client, tmp_path
):
    """The teacher and the --init export live outside the run directory: only the launcher's mounts show them."""
    from tests.upcycle.teachers import tiny_llama

    from zebra.upcycle import StudentOptions, upcycle

    teacher = tiny_llama(tmp_path / "models" / "teacher")
    student = tmp_path / "models" / "student"
    upcycle(str(teacher), student, StudentOptions(mixer="gdn", mla=1))
    result = zebra(
        "train", *TINY, "--init", str(student), "--teacher", str(teacher), "--launcher", "docker",
        *hostbind_flags(hostbind_image), "-o", str(tmp_path / "runs"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    records = [
        json.loads(line) for line in (tmp_path / "runs" / "tiny" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records if "kl" in r] == list(range(1, STEPS + 1))
    assert not containers_of(docker_client, tmp_path / "runs" / "tiny")
