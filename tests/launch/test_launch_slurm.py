"""The slurm launcher against a real Slurm cluster (munged, slurmctld and two slurmd on this machine, started by
.ci/run): a job of two CPU tasks (gloo) trains exactly like two local ranks, a job pre-empted through
submitit's signal saves, is requeued and resumes from its checkpoint to the same losses; over two nodes, a
followed job survives `scontrol requeue` to its end, and `zebra jobs cancel` makes both nodes save and stop."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zebra.train.checkpoint import committed, read_meta

from .helpers import SETS, STEPS, TINY, hostbind_flags, losses, recording, started_with

pytestmark = pytest.mark.infra

SLURM_TASKS = [*TINY, "--launcher", "slurm", "--nproc", "2"]


@pytest.fixture(scope="module")
def local_two_ranks(tmp_path_factory) -> list[tuple[int, float]]:
    """The reference: the same run on two local ranks through the elastic agent."""
    from zebra.launch import make_plan, start
    from zebra.recipes import load_recipe
    from zebra.recipes.loader import combine, parse_assignments
    from zebra.train.run import data_overrides, prepare_run

    output = tmp_path_factory.mktemp("local")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEBRA_TENSORBOARD", "0")
        sets = combine(
            parse_assignments(["launch.launcher=local", *SETS]),
            data_overrides(None, mock_data=True, max_steps=STEPS),
        )
        plan = make_plan(load_recipe("tiny", overrides=sets), nproc=2, output=output)
        prepare_run(plan.run)
        start(plan)
    return losses(plan.run_dir)


@pytest.fixture
def cancel_jobs_left(zebra_env, tmp_path):
    """scancel whatever job a failed or timed-out test left behind (a leftover holds a node and leaves the next
    tests' jobs pending): the jobs of its registry, and any job logging under its folder (one submitted by a
    process killed before it wrote the registry)."""
    yield
    registry = Path(zebra_env["ZEBRA_CACHE"]) / "jobs.json"
    ids = {job["id"] for job in json.loads(registry.read_text())} if registry.is_file() else set()
    queue = subprocess.run(["squeue", "-h", "-O", "JobID:30,StdOut:4000"], capture_output=True, text=True)
    for line in queue.stdout.splitlines():
        job_id, _, stdout = line.partition(" ")
        if stdout.strip().startswith(f"{tmp_path}/"):
            ids.add(job_id)
    if ids:
        subprocess.run(["scancel", *sorted(ids)], capture_output=True)


def assert_same_losses(run_dir: Path, reference: list[tuple[int, float]]) -> None:
    got = losses(run_dir)
    assert [s for s, _ in got] == [s for s, _ in reference] == list(range(1, STEPS + 1))
    for (step, a), (_, b) in zip(got, reference, strict=True):
        assert math.isclose(a, b, rel_tol=1e-5), f"step {step}: slurm {a} vs local {b}"


def test_two_tasks_train_like_two_local_ranks(
    zebra, slurm_cluster, local_two_ranks, tmp_path, cancel_jobs_left
):
    result = zebra("train", *SLURM_TASKS, "--partition", slurm_cluster, "-o", str(tmp_path), "--follow")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "submitted Slurm job" in result.stdout and f"step {STEPS}/{STEPS}" in result.stdout
    )  # task 0's log, followed
    run_dir = tmp_path / "tiny"
    assert_same_losses(run_dir, local_two_ranks)
    job_id = result.stdout.split("submitted Slurm job ")[1].split(":")[0]
    exits = sorted(
        json.loads(p.read_text())["exit_code"] for p in (run_dir / "slurm").glob(f"{job_id}_*_exit.json")
    )
    assert exits == [0, 0]
    listed = json.loads(zebra("jobs", "list", "--json").stdout)
    assert [(j["id"], j["state"], j["exit_code"]) for j in listed] == [(job_id, "COMPLETED", 0)]


def test_a_run_directory_in_use_is_refused_before_a_job_is_submitted(
    zebra, slurm_cluster, tmp_path, hold_folder, cancel_jobs_left
):
    pid = hold_folder(tmp_path / "tiny")
    refused = zebra("train", *SLURM_TASKS, "--partition", slurm_cluster, "-o", str(tmp_path))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"{tmp_path / 'tiny'}: in use by pid {pid} on" in " ".join(refused.stderr.split())
    assert json.loads(zebra("jobs", "list", "--json").stdout) == []


PARTITIONS = "--all -h -o %P %l"  # the query of the partitions and their time limits
NODE_GPUS = "--all -h -o %P %D %G"  # the query of the nodes' GPUs


@pytest.mark.parametrize(
    ("flags", "asked"),
    [
        (["--nproc", "1", "--partition", "{partition}"], [PARTITIONS]),  # the plan checks the partition
        (["--nproc", "1", "--time", "10"], []),  # nothing to check; a run's time limit is read at submission
        (
            ["--partition", "{partition}"],
            [NODE_GPUS],
        ),  # the GPUs per node; the nodes here have none: an error
    ],
)
def test_a_slurm_plan_asks_sinfo_each_query_once(cli, slurm_cluster, tmp_path, flags, asked):
    env, calls = recording(tmp_path, "sinfo")
    args = [*TINY, "--launcher", "slurm", *(f.format(partition=slurm_cluster) for f in flags), "--dry-run"]
    result = cli("train", *args, "-o", str(tmp_path / "runs"), env=env)
    assert result.exit_code == (1 if NODE_GPUS in asked else 0), result.output
    assert calls("sinfo") == asked
    assert not (tmp_path / "runs").exists()


def test_a_launch_asks_sinfo_once_and_hands_the_job_no_value_torch_wrote(
    zebra_env, zebra, slurm_cluster, tmp_path, cancel_jobs_left
):
    """The plan checks the partition, the launcher checks it again before writing anything and the submission
    reads its time limit (no --time): one sinfo query. On a fresh cache the launcher tokenizes the sample corpus
    (`import megatron.core`, whose torch.compile decorators make inductor write its folder into os.environ); the
    job inherits this environment through sbatch: without that folder, with what the shell exported."""
    zebra_env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the user sets none
    env, calls = recording(tmp_path, "sinfo", "sbatch")
    steps = ["--max-steps", "2", *(a for s in SETS for a in ("--set", s))]
    args = ["tiny", *steps, "--launcher", "slurm", "--nproc", "1", "--partition", slurm_cluster]
    result = zebra("train", *args, "-o", str(tmp_path / "runs"), env={**env, "TORCH_WARM_POOL": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "submitted Slurm job" in result.stdout
    assert calls("sinfo") == [PARTITIONS]
    job_env = started_with(tmp_path, "sbatch")
    assert "TORCHINDUCTOR_CACHE_DIR" not in job_env, job_env["TORCHINDUCTOR_CACHE_DIR"]
    assert job_env["TORCH_WARM_POOL"] == "0" and job_env["ZEBRA_CACHE"] == zebra_env["ZEBRA_CACHE"]


def wait_for(condition, what: str, timeout: float = 300, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)
    return value


def squeue_state(job_id: str) -> str:
    r = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True
    )
    return r.stdout.strip()


def test_preempted_job_is_requeued_and_resumes(
    zebra, slurm_cluster, local_two_ranks, tmp_path, cancel_jobs_left
):
    submitted = zebra("train", *SLURM_TASKS, "--partition", slurm_cluster, "-o", str(tmp_path))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.split("submitted Slurm job ")[1].split(":")[0]
    run_dir = tmp_path / "tiny"
    wait_for(lambda: (run_dir / "checkpoints" / "latest").is_file(), "the first checkpoint")
    # What Slurm sends before a time limit and submitit's pre-emption test sends: USR2 to every task.
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    wait_for(lambda: squeue_state(job_id) == "PENDING", "the requeue")
    second = zebra("train", *TINY, "-o", str(tmp_path))  # the queued job holds the run directory
    assert second.returncode == 1 and f"in use by Slurm job {job_id}" in " ".join(second.stderr.split())
    # Slurm holds a requeued job back for two minutes (BeginTime); let it start sooner, though not within the
    # second its old credential was revoked in (slurmd would refuse to launch it).
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now+3"], check=True)
    followed = zebra("jobs", "logs", job_id, "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    log = (run_dir / "slurm" / f"{job_id}_0_log.out").read_text()
    assert "saving a checkpoint before the requeue" in log and "(restart 1)" in log
    resumed_at = int(log.split("resumed from ")[1].split("step ")[1].split(",")[0])
    assert 2 <= resumed_at < STEPS
    assert_same_losses(run_dir, local_two_ranks)  # the resumed run read the same data in the same order


def test_each_node_can_run_its_ranks_in_a_container(
    zebra, slurm_cluster, hostbind_image, docker_client, local_two_ranks, tmp_path, cancel_jobs_left
):
    secret = "hf_slurmContainerSecret_987654321"
    marked, url = (
        "db-pass-marked-slurm-77",
        "https://bob:pw-in-slurm-url@127.0.0.1:9/x",
    )  # --secret-env, a URL
    probe = (
        'test -n "$HF_TOKEN" && test "$HF_TOKEN" = "$EXPECTED_TOKEN" && test "$DB_PASS" = "$EXPECTED_DB_SECRET" '
        '&& test "$WANDB_BASE_URL" = "$EXPECTED_URL_SECRET" && echo token-arrived'
    )
    result = zebra(
        "train", *SLURM_TASKS, "--container", *hostbind_flags(hostbind_image), "--partition", slurm_cluster,
        "-o", str(tmp_path), "--env", "EXPECTED_*", "--secret-env", "DB_PASS",
        "--set", f"launch.container_setup={probe}", "--follow",
        env={"HF_TOKEN": secret, "EXPECTED_TOKEN": secret, "DB_PASS": marked, "EXPECTED_DB_SECRET": marked,
             "WANDB_BASE_URL": url, "EXPECTED_URL_SECRET": url},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "tiny"
    assert "token-arrived" in result.stdout
    assert_same_losses(run_dir, local_two_ranks)
    for value in (secret, marked, "pw-in-slurm-url"):
        assert value not in result.stdout + result.stderr
        written = [p for p in tmp_path.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
        assert written == []  # not in the pickled task, the logs, the registry or the run
    assert not docker_client.containers.list(all=True, filters={"label": f"zebra.run_dir={run_dir}"})


TWO_NODES = [*TINY, "--launcher", "slurm", "--nodes", "2", "--nproc", "1"]


def job_id_of(stdout: str) -> str:
    return stdout.split("submitted Slurm job ")[1].split(":")[0]


def task_exits(run_dir: Path, job_id: str) -> list[int]:
    return sorted(
        json.loads(p.read_text())["exit_code"] for p in (run_dir / "slurm").glob(f"{job_id}_*_exit.json")
    )


def test_two_nodes_follow_a_job_through_a_requeue_to_its_end(
    zebra_env, zebra, slurm_two_nodes, tmp_path, cancel_jobs_left
):
    steps = 40  # long enough for the requeue to land mid-run
    cmd = [sys.executable, "-m", "zebra.cli.main", "train", *TWO_NODES, "--max-steps", str(steps),
           "--partition", slurm_two_nodes, "-o", str(tmp_path / "runs"), "--follow"]  # fmt: skip
    with open(tmp_path / "follow.out", "w") as out:
        follower = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=zebra_env, text=True)  # fmt: skip
    run_dir = tmp_path / "runs" / "tiny"
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "latest").is_file(), "the first checkpoint")
        job_id = job_id_of((tmp_path / "follow.out").read_text())
        subprocess.run(["scontrol", "requeue", job_id], check=True)  # what a pre-empting Slurm does
        wait_for(lambda: squeue_state(job_id) == "PENDING", "the requeue")
        subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now+3"], check=True)
        assert follower.wait(timeout=600) == 0, (tmp_path / "follow.out").read_text()
    finally:
        follower.kill()  # a no-op once it ended; cancel_jobs_left then cancels the job
    followed = (tmp_path / "follow.out").read_text()
    assert "(restart 0)" in followed and "(restart 1)" in followed and f"step {steps}/{steps}" in followed
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["tiny"]  # one run folder
    assert [s for s, _ in losses(run_dir)] == list(range(1, steps + 1))  # rank 0's metrics, each step once
    final = committed(run_dir / "checkpoints")[0]
    assert (read_meta(final)["step"], read_meta(final)["world_size"]) == (steps, 2)
    assert task_exits(run_dir, job_id) == [0, 0]
    log = zebra("jobs", "logs", job_id, "--follow")
    assert log.returncode == 0, log.stdout + log.stderr
    assert log.stdout.rstrip().endswith(f"job {job_id} completed")  # after the log, the end is said
    first, second = log.stdout.split("(restart 1)")  # both attempts, in order
    assert "(restart 0)" in first and "stopped by SIGTERM" in first
    resumed = int(second.split("resumed from ")[1].split("(step ")[1].split(",")[0])
    assert 2 <= resumed < steps


def test_cancel_makes_both_nodes_save_and_stop(zebra, slurm_two_nodes, tmp_path, cancel_jobs_left):
    args = [*TWO_NODES, "--max-steps", "1000", "--set", "train.save_interval=0"]
    submitted = zebra("train", *args, "--partition", slurm_two_nodes, "-o", str(tmp_path))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = job_id_of(submitted.stdout)
    run_dir = tmp_path / "tiny"
    wait_for(lambda: len(losses(run_dir)) >= 2 if (run_dir / "metrics.jsonl").is_file() else False, "step 2")

    cancelled = zebra("jobs", "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    wait_for(lambda: len(task_exits(run_dir, job_id)) == 2, "both tasks to end")
    assert task_exits(run_dir, job_id) == [0, 0]  # each node's rank saved and exited cleanly
    (saved,) = committed(run_dir / "checkpoints")
    assert read_meta(saved)["world_size"] == 2 and 2 <= read_meta(saved)["step"] < 1000
    assert sorted(p.name for p in saved.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert "stopped by SIGTERM" in (run_dir / "slurm" / f"{job_id}_0_log.out").read_text()
