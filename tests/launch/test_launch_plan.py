"""`zebra train --dry-run` for each launcher: the complete plan (sbatch parameters, container spec, torchrun
arguments), with secret values masked everywhere and nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_results import assert_one_line_error
from zebra.data.paths import DataPath
from zebra.launch import make_plan, with_launch_lists
from zebra.launch.container import container_mounts
from zebra.launch.environment import MASK, EnvVar, is_secret, mask_urls, passthrough, resolve
from zebra.recipes import load_recipe

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"HF_TOKEN": "hf_fakeSecretValue0123456789", "WANDB_API_KEY": "wandb-fake-secret-abcdef"}
ENV = {**SECRETS, "NCCL_DEBUG": "INFO", "HSA_ENABLE_SDMA": "0", "SOME_OTHER_VAR": "not-passed"}


def dry_run(cli, tmp_path, *args: str, env: dict[str, str] | None = None) -> dict:
    runs = str(tmp_path / "runs")
    result = cli("train", *args, "--mock-data", "--dry-run", "--json", "-o", runs, env={**ENV, **(env or {})})
    assert result.exit_code == 0, result.output
    for value in SECRETS.values():
        assert value not in result.output
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
    return json.loads(result.stdout)


def fake_sinfo(tmp_path, lines: str, gres: str = "") -> dict[str, str]:
    """The environment of a machine whose `sinfo` prints `lines` (partitions and time limits), or `gres` when
    asked for the nodes' generic resources (`%G`), whatever Slurm runs here."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    sinfo = bin_dir / "sinfo"
    sinfo.write_text(f"#!/bin/sh\ncase \"$*\" in *%G*) printf '{gres}';; *) printf '{lines}';; esac\n")
    sinfo.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_slurm_plan_two_nodes_of_eight_gpus(cli, tmp_path):
    info = dry_run(
        cli, tmp_path, "1b-gdn-pure", "--launcher", "slurm", "--nodes", "2", "--gpus", "8",
        "--partition", "mi300x", "--account", "proj42", "--qos", "high", "--time", "1-12:00:00",
        "--sbatch-extra=--exclusive", "--sbatch-extra=--mem=0",
        env=fake_sinfo(tmp_path, "debug* 1:00:00\\nmi300x 2-00:00:00\\n"),
    )  # fmt: skip
    assert (info["world_size"], info["micro_batch"] * 16 * info["accumulation"]) == (16, info["global_batch"])
    launch = info["launch"]
    assert (launch["launcher"], launch["nodes"], launch["ranks_per_node"], launch["world_size"]) == (
        "slurm",
        2,
        8,
        16,
    )
    sbatch = launch["slurm"]["sbatch"]
    assert sbatch["nodes"] == 2 and sbatch["ntasks-per-node"] == 8 and sbatch["gpus-per-node"] == 8
    assert (sbatch["partition"], sbatch["account"], sbatch["qos"], sbatch["time"]) == (
        "mi300x",
        "proj42",
        "high",
        "1-12:00:00",
    )
    assert sbatch["exclusive"] is True and sbatch["mem"] == "0"
    run_dir = str(tmp_path / "runs" / "1b-gdn-pure")
    assert sbatch["output"] == f"{run_dir}/slurm/%j_%t_log.out" and sbatch["signal"].startswith("USR2@")
    assert launch["slurm"]["tasks"] == 16
    assert "torchrun" not in launch  # each task is one rank
    assert launch["rank_command"].split()[1:] == [
        "-m", "zebra.cli.rank", run_dir, "--resume", "auto", "--device", "cuda",
    ]  # fmt: skip
    assert launch["env"]["HF_TOKEN"] == MASK and launch["env"]["WANDB_API_KEY"] == MASK
    assert launch["env"]["NCCL_DEBUG"] == "INFO" and "SOME_OTHER_VAR" not in launch["env"]


@pytest.mark.parametrize("sinfo", [True, False])
def test_a_partition_the_cluster_lacks_is_refused_by_the_plan(cli, tmp_path, sinfo):
    """Where a Slurm client answers, --dry-run (and the run, before it writes anything) checks the partition;
    a plan made elsewhere (no sinfo here) is for another cluster and is not checked."""
    env = fake_sinfo(tmp_path, "debug* 1:00:00\\ngpu 2-00:00:00\\n") if sinfo else {"PATH": str(tmp_path)}
    args = ["tiny", "--launcher", "slurm", "--nproc", "1", "--partition", "nosuch", "--dry-run"]
    result = cli("train", *args, "-o", str(tmp_path / "runs"), env=env)
    if sinfo:
        error = assert_one_line_error(result)
        assert "--partition nosuch: no such partition" in error and "debug, gpu" in error, error
    else:
        assert result.exit_code == 0, result.output
    assert not (tmp_path / "runs").exists()


def test_slurm_ranks_per_node_default_to_the_gpus_sinfo_shows_on_the_nodes(cli, tmp_path):
    partitions, gres = (
        "cpu* infinite\\ngpu 1-00:00:00\\n",
        "cpu* 4 (null)\\ngpu 2 gpu:mi300x:8(S:0-1),nvme:1\\n",
    )
    env = fake_sinfo(tmp_path, partitions, gres=gres)
    info = dry_run(cli, tmp_path, "1b-gdn-pure", "--launcher", "slurm", "--partition", "gpu", env=env)
    assert (info["launch"]["device"], info["launch"]["ranks_per_node"]) == ("cuda", 8)
    assert info["launch"]["slurm"]["sbatch"]["gpus-per-node"] == 8


@pytest.mark.parametrize(
    ("gres", "needle"),
    [
        ("debug* 2 (null)\\n", "the default partition has 2 node(s) with no GPU(s) (sinfo)"),
        ("debug* 1 gpu:8\\ndebug* 1 gpu:4\\n", "has 1 node(s) with 4 GPU(s), 1 node(s) with 8 GPU(s)"),
        (None, "no Slurm client here (sinfo) shows the nodes' GPUs"),
    ],
)
def test_slurm_without_gpus_or_nproc_says_what_the_nodes_have(cli, tmp_path, gres, needle):
    env = fake_sinfo(tmp_path, "", gres=gres) if gres is not None else {"PATH": str(tmp_path)}
    result = cli("train", "tiny", "--launcher", "slurm", "--dry-run", "-o", str(tmp_path / "runs"), env=env)
    error = assert_one_line_error(result)
    assert "how many ranks per node?" in error and needle in error, error
    assert "--nproc N" in result.stderr


def test_human_dry_run_masks_secrets_too(cli, tmp_path):
    args = [
        "1b-gdn-pure",
        "--launcher",
        "slurm",
        "--gpus",
        "8",
        "--mock-data",
        "--dry-run",
        "-o",
        str(tmp_path),
    ]
    result = cli("train", *args, env=ENV)
    assert result.exit_code == 0, result.output
    assert f"HF_TOKEN={MASK}" in result.stdout and "--gpus-per-node" in result.stdout
    assert not any(value in result.output for value in SECRETS.values())


def test_human_dry_run_shows_each_row_once(cli, tmp_path):
    args = [
        "tiny",
        "--nproc",
        "2",
        "--nodes",
        "2",
        "--rdzv-endpoint",
        "node1:29500",
        "--mock-data",
        "--dry-run",
    ]
    result = cli("train", *args, "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    first_cells = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    assert first_cells.count("ranks") == 1 and first_cells.count("rendezvous") == 1
    assert "2 node(s) x 2 cpu rank(s) = 4" in result.stdout and "node1:29500" in result.stdout


def test_rocm_container_plan(cli, tmp_path):
    info = dry_run(
        cli, tmp_path, "1b-gdn-pure", "--launcher", "docker", "--gpus", "8", "--set", "launch.gpu_vendor=amd"
    )
    launch = info["launch"]
    c = launch["container"]
    assert c["image"] == "rocm/primus:v25.10" and c["gpu_vendor"] == "amd"
    assert {"/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"} <= set(c["devices"]) and c["group_add"]
    assert (c["ipc_mode"], c["network_mode"], c["security_opt"], c["cap_add"]) == (
        "host", "host", ["seccomp=unconfined"], ["SYS_PTRACE"],
    )  # fmt: skip
    assert c["device_requests"] == [] and c["shm_size"] and c["init"] is True
    run_dir = str(tmp_path / "runs" / "1b-gdn-pure")
    assert f"{REPO_ROOT}:{REPO_ROOT}:ro" in c["mounts"] and f"{run_dir}:{run_dir}:rw" in c["mounts"]
    assert c["env"]["HF_TOKEN"] == MASK and c["env"]["HSA_ENABLE_SDMA"] == "0"
    assert c["env"]["PYTHONPATH"].split(":")[0] == str(REPO_ROOT / "src")
    assert launch["torchrun"][:3] == ["--nproc-per-node=8", "--nnodes=1", "--standalone"]
    assert launch["torchrun"][3:6] == ["-m", "zebra.cli.rank", run_dir]
    assert c["command"].startswith("python3 -m torch.distributed.run --nproc-per-node=8")


def test_nvidia_container_plan(cli, tmp_path):
    info = dry_run(
        cli, tmp_path, "1b-gdn-pure", "--launcher", "docker", "--gpus", "4",
        "--image", "nvcr.io/nvidia/pytorch:25.01-py3", "--set", "launch.gpu_vendor=nvidia",
    )  # fmt: skip
    c = info["launch"]["container"]
    assert c["device_requests"] == [{"driver": "nvidia", "count": 4, "capabilities": [["gpu"]]}]
    assert c["devices"] == [] and c["security_opt"] == [] and c["image"].startswith("nvcr.io/")
    assert c["env"]["WANDB_API_KEY"] == MASK and "--nproc-per-node=4" in c["command"]


def test_slurm_with_container_runs_one_container_per_node(cli, tmp_path):
    info = dry_run(
        cli, tmp_path, "1b-gdn-pure", "--launcher", "slurm", "--container", "--nodes", "2", "--gpus", "8",
        "--set", "launch.gpu_vendor=amd",
    )  # fmt: skip
    launch = info["launch"]
    assert (
        launch["slurm"]["sbatch"]["ntasks-per-node"] == 1 and launch["slurm"]["sbatch"]["gpus-per-node"] == 8
    )
    assert launch["slurm"]["tasks"] == 2 and "container" in launch["slurm"]["task_runs"]
    assert launch["torchrun"][:4] == [
        "--nproc-per-node=8",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=FIRST_NODE:PORT",
    ]
    assert launch["container"]["gpu_vendor"] == "amd" and launch["container"]["env"]["HF_TOKEN"] == MASK


def test_local_plan_shows_torchrun(cli, tmp_path):
    info = dry_run(cli, tmp_path, "tiny", "--nproc", "2")
    assert info["launch"]["launcher"] == "local" and "container" not in info["launch"]
    assert info["launch"]["torchrun"][:3] == ["--nproc-per-node=2", "--nnodes=1", "--standalone"]


def test_container_mounts_data_tokenizer_and_user_mounts(tmp_path, monkeypatch):
    data, tokenizer, extra = tmp_path / "data", tmp_path / "tok", tmp_path / "extra"
    for d in (data, tokenizer, extra):
        d.mkdir()
    recipe = load_recipe("tiny", overrides=["launch.launcher=docker", "data.mock=true"])
    run = make_plan(with_launch_lists(recipe, mounts=[f"{extra}:/extra:ro"]), output=tmp_path / "runs").run
    run.recipe.data.mock = False
    run.recipe.data.paths = [
        DataPath(f"{data}/a_text_document", 0.5),
        DataPath(f"{data}/b_text_document", 0.5),
    ]
    run.recipe.data.tokenizer = str(tokenizer)
    mounts = {m.target: m for m in container_mounts(run)}
    assert mounts[str(data)].read_only and mounts[str(data)].purpose == "data"  # one mount for both prefixes
    assert mounts[str(tokenizer)].purpose == "tokenizer"
    assert mounts["/extra"].source == str(extra) and mounts["/extra"].read_only
    assert not mounts[str(run.run_dir.resolve())].read_only


def test_container_mounts_the_teacher_file_folder_and_the_init_export(tmp_path):
    models, init = tmp_path / "models", tmp_path / "upcycled"
    models.mkdir()
    init.mkdir()
    (models / "teacher.gguf").write_bytes(b"GGUF")
    recipe = load_recipe("tiny", overrides=["launch.launcher=docker", "data.mock=true"])
    run = make_plan(recipe, output=tmp_path / "runs").run
    run.recipe.distill.teacher = str(models / "teacher.gguf")
    run.recipe.train.init = str(init)
    mounts = {m.target: m for m in container_mounts(run)}
    assert mounts[str(models)].purpose == "teacher" and mounts[str(models)].read_only  # the file's folder
    assert mounts[str(init)].purpose == "init" and mounts[str(init)].read_only
    run.recipe.distill.teacher = "HuggingFaceTB/SmolLM2-135M"  # a hub id: through the HF cache, no mount
    assert not any(m.purpose == "teacher" for m in container_mounts(run))


def test_a_relative_resume_path_reaches_the_container_absolute_and_mounted(tmp_path, monkeypatch):
    """--resume runs/old/checkpoints/step_0000050 is relative to where zebra was started; the container starts
    in the run folder: its rank command gets the absolute path, and that folder is bound read-only."""
    checkpoint = tmp_path / "runs" / "old" / "checkpoints" / "step_0000050"
    checkpoint.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe("tiny", overrides=["launch.launcher=docker", "data.mock=true"])
    plan = make_plan(recipe, output=tmp_path / "runs", run="new", resume="runs/old/checkpoints/step_0000050")
    assert plan.rank_command[plan.rank_command.index("--resume") + 1] == str(checkpoint)
    mounts = {m.target: m for m in container_mounts(plan.run)}
    assert mounts[str(checkpoint)].purpose == "resume" and mounts[str(checkpoint)].read_only


def test_the_secret_check_names_credentials():
    assert all(map(is_secret, ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_PASSWORD"]))
    assert not any(map(is_secret, ["NCCL_DEBUG", "HF_HOME", "TOKENIZERS_PARALLELISM"]))


def test_passthrough_is_an_allow_list_with_extra_names():
    env = {
        "HF_TOKEN": "t",
        "NCCL_IB_HCA": "mlx5",
        "CUDA_HOME": "/usr/local/cuda",
        "PATH": "/bin",
        "MY_FLAG": "1",
    }
    names = [v.name for v in passthrough(env)]
    assert names == ["HF_TOKEN", "NCCL_IB_HCA"]  # CUDA_HOME is blocked, PATH and MY_FLAG not allowed
    assert [v.name for v in passthrough(env, extra=["MY_FLAG"])] == ["HF_TOKEN", "MY_FLAG", "NCCL_IB_HCA"]


MARKED = {"DB_PASS": "db-pass-4567", "GH_PAT": "ghp_personalAccess789"}  # secrets no name gives away
URL = ("WANDB_BASE_URL", "https://alice:pw-in-url-123@wandb.example:8080/api")


@pytest.mark.parametrize("json_", [True, False])
def test_url_credentials_and_variables_marked_secret_are_masked(cli, tmp_path, json_):
    args = ["tiny", "--launcher", "docker", "--nproc", "1", "--mock-data", "--dry-run", "-o", str(tmp_path)]
    marks = [a for name in MARKED for a in ("--secret-env", name)]
    result = cli("train", *args, *marks, *(["--json"] if json_ else []), env={**MARKED, URL[0]: URL[1]})
    assert result.exit_code == 0, result.output
    for value in [*MARKED.values(), "pw-in-url-123", "alice"]:
        assert value not in result.output
    if json_:
        launch = json.loads(result.stdout)["launch"]
        for env in (launch["env"], launch["container"]["env"]):
            assert env["DB_PASS"] == env["GH_PAT"] == MASK  # passed to the ranks, never shown
            assert env[URL[0]] == f"https://{MASK}@wandb.example:8080/api"
    else:
        assert f"DB_PASS={MASK}" in result.stdout and f"https://{MASK}@wandb.example" in result.stdout


PLAN_OF_A_RUN = """import json, os, sys
from zebra.launch import make_plan
from zebra.recipes import load_recipe

plan = make_plan(load_recipe("tiny", overrides=["launch.launcher=slurm"]), nproc=1, output=sys.argv[1])
print(json.dumps({"passed": plan.describe()["env"], "here": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}))
"""


def test_the_ranks_get_no_inductor_folder_torch_chose_for_this_process(zebra_env, tmp_path):
    """On a fresh cache a run's plan (not a dry run's: that tokenizes nothing) tokenizes the sample corpus, which
    imports megatron.core, whose torch.compile decorators make inductor write its default folder
    (/tmp/torchinductor_USER) into os.environ: the plan must not hand that to the ranks as if the user had
    chosen it (each rank picks zebra's kernel cache)."""
    import subprocess
    import sys

    from zebra.core.caches import inductor_default_dir

    # the user sets none (an earlier test of this process may have left zebra's own cache folder there)
    zebra_env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    mine = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")}
    for env in ({}, mine):
        result = subprocess.run(
            [sys.executable, "-c", PLAN_OF_A_RUN, str(tmp_path / "runs")],
            env={**zebra_env, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen["here"] == env.get("TORCHINDUCTOR_CACHE_DIR", inductor_default_dir())  # torch wrote it
        assert seen["passed"].get("TORCHINDUCTOR_CACHE_DIR") == env.get("TORCHINDUCTOR_CACHE_DIR"), seen
    assert passthrough({"TORCHINDUCTOR_CACHE_DIR": inductor_default_dir()}) == []


def test_a_container_plan_of_the_sample_binds_its_cache_folder_that_only_the_run_writes(cli, tmp_path):
    """A dry run on @sample with an empty cache tokenizes nothing: its container spec binds the folder the run
    will tokenize it into (the same one a run's plan, which tokenizes it, names)."""
    args = ["tiny", "--launcher", "docker", "--nproc", "1", "--data", "@sample", "--dry-run", "--json"]
    result = cli("train", *args, "-o", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    folder = Path(info["data"][0].removesuffix(":1.0")).parent
    assert folder.parent == (tmp_path / "cache" / "sample").resolve()
    assert f"{folder}:{folder}:ro" in info["launch"]["container"]["mounts"]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()
    recipe = load_recipe("tiny", overrides=["launch.launcher=docker", "data.paths=[@sample]"])
    run = make_plan(recipe, nproc=1, output=tmp_path / "runs").run
    assert list(map(str, run.recipe.data.paths)) == info["data"] and (folder / "manifest.json").is_file()


TORCH_WRITES_HERE = """import os
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

AsyncCompile.process_pool()  # compile workers started by spawn: inductor writes TORCH_WARM_POOL=0 (and its folder)
os.environ.setdefault("TRITON_CACHE_DIR", triton_cache_dir(0))  # what its first Triton kernel on a GPU does
from zebra.launch.environment import passthrough

print(dict((v.name, v.value) for v in passthrough()))
"""


@pytest.mark.parametrize("exported", [False, True])
def test_the_ranks_get_what_the_shell_exported_not_what_torch_wrote(tmp_path, exported):
    """Torch's own writes into os.environ, made by torch itself in a process of their own: none reaches the ranks;
    the same names exported in the shell do (TORCH_WARM_POOL=0 is torch's value and a choice one makes)."""
    import ast
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(TORCHINDUCTOR_WORKER_START="spawn", TORCHINDUCTOR_COMPILE_THREADS="2")
    yours = {"TORCH_WARM_POOL": "0", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")} if exported else {}
    result = subprocess.run(
        [sys.executable, "-c", TORCH_WRITES_HERE],
        env={**env, **yours},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    passed = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    torchs = ("TORCH_WARM_POOL", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    assert {k: passed[k] for k in torchs if k in passed} == yours
    assert passed["TORCHINDUCTOR_WORKER_START"] == "spawn"  # the rest of the allow-list as before


def test_each_plan_asks_sinfo_again(tmp_path, monkeypatch):
    """sinfo's answers are kept for one launch (its plan), not for the process: a partition added since the last
    plan is there for the next one."""
    from zebra.core.errors import ZebraError

    sets = ["launch.launcher=slurm", "launch.partition=gpu", "data.mock=true"]
    recipe = load_recipe("tiny", overrides=sets)
    monkeypatch.setenv("PATH", fake_sinfo(tmp_path, "debug* 1:00:00\\n")["PATH"])
    with pytest.raises(ZebraError, match="--partition gpu: no such partition"):
        make_plan(recipe, nproc=1, output=tmp_path / "runs")
    monkeypatch.setenv("PATH", fake_sinfo(tmp_path, "debug* 1:00:00\\ngpu 2:00:00\\n")["PATH"])
    plan = make_plan(recipe, nproc=1, output=tmp_path / "runs")
    assert plan.sinfo.asked == ["%P %l"] and plan.slurm.partition == "gpu"


def test_url_credentials_are_masked_in_any_value_and_never_pickled():
    text = "a http://u@h1/x b https://u:p@h2/p@q c user@host d https://h3/no-user"
    assert mask_urls(text) == f"a http://{MASK}@h1/x b https://{MASK}@h2/p@q c user@host d https://h3/no-user"
    var = EnvVar(*URL)
    assert var.shown() == f"https://{MASK}@wandb.example:8080/api"
    assert var.without_secret().value is None  # a Slurm job's pickled task reads it again on the node
    plain = EnvVar("WANDB_BASE_URL", "https://wandb.example")
    assert plain.without_secret() == plain


def test_secret_env_names_patterns_and_passes_them():
    env = {"DB_PASS": "x", "MY_PAT_1": "y", "PATH": "/bin", "NCCL_DEBUG": "INFO"}
    got = {v.name: v.secret for v in passthrough(env, secret=["DB_PASS", "MY_PAT_*"])}
    assert got == {"DB_PASS": True, "MY_PAT_1": True, "NCCL_DEBUG": False}


def test_secret_values_are_read_again_where_the_rank_starts():
    var = EnvVar("HF_TOKEN", "hf_abc", secret=True)
    kept = var.without_secret()
    assert kept.value is None and kept.shown() == MASK
    assert resolve([kept], {"HF_TOKEN": "hf_from_the_job"}) == {"HF_TOKEN": "hf_from_the_job"}
    assert resolve([kept], {}) == {}


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("90", 90),
        ("30:30", 31),
        ("24:00:00", 1440),
        ("2-00", 2880),
        ("1-12:30", 2190),
        ("1-0:0:1", 1441),
        ("infinite", None),
    ],
)
def test_slurm_time_formats(text, minutes):
    from zebra.launch.slurm_spec import parse_time

    assert parse_time(text) == minutes


@pytest.mark.parametrize(("allowed", "ranks", "threads"), [(8, 2, 4), (8, 16, 1), (3, 2, 1)])
def test_threads_per_rank_divide_the_cores_this_process_may_use(monkeypatch, allowed, ranks, threads):
    """A Slurm step or a container allows fewer cores than the node has: OMP threads follow the allowed ones."""
    from zebra.launch.commands import cpu_threads_per_rank

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(allowed)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    assert cpu_threads_per_rank(ranks) == threads
