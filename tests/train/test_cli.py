"""`zebra train` and `zebra plot` through the CLI: one-line errors for bad recipes, flags and data, the dry-run
plan, and loss-curve plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and all(not line.startswith("error") for line in lines[1:])
    assert len([line for line in lines if not line.startswith(" ")]) <= 2, lines  # error + hint
    text = " ".join(result.stderr.split())
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["nosuch"], ["unknown recipe 'nosuch'"]),
        (["tiny", "--set", "train.lr=fast"], ["--set: train.lr: got 'fast' (expected a number)"]),
        (["tiny", "--set", "train.bogus=1"], ["--set: train.bogus: unknown key"]),
        (["tiny", "--set", "train.nonfinite=ignore"], ["train.nonfinite", "skip, stop"]),
        (["tiny", "--set", "model.hidden_size=4"], ["model.hidden_size: 4 is below the minimum"]),
        (["tiny", "--set", "train.lr"], ["expected KEY=VALUE"]),
        (["tiny", "--nproc", "3"], ["global_batch_size 8 does not split over 3 ranks"]),
        (["tiny", "--gpus", "1"], ["--gpus 1: no GPU is visible here", "--nproc"]),
        (["tiny", "--nproc", "2", "--gpus", "2"], ["--gpus and --nproc exclude each other"]),
        (["tiny", "--nodes", "2", "--nproc", "1"], ["--nodes 2", "--rdzv-endpoint"]),
        (["tiny", "--mock-data", "--data", "x"], ["--data and --mock-data exclude each other"]),
        (["tiny", "--data", "/nonexistent/prefix"], ["/nonexistent/prefix"]),
        (["tiny", "--set", "model.vocab_size=200"], ["has 259 ids but model.vocab_size is 200"]),
        (["tiny", "--resume", "/nonexistent/ckpt"], ["--resume /nonexistent/ckpt: no such checkpoint"]),
        (["tiny", "--set", "data.paths=[]"], ["no training data", "--mock-data"]),
        (
            ["tiny", "--data", "@sample", "--set", "data.split=0,1,0"],
            ["'0,1,0' leaves no documents for training"],
        ),
        (["tiny", "--run", "../x", "--dry-run"], ["--run '../x': a run name is one folder name"]),
        (["tiny", "--run", "/tmp/x", "--dry-run"], ["--run '/tmp/x': a run name is one folder name"]),
        ([], ["missing RECIPE"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_input_is_one_line(cli, tmp_path, args, needles):
    _one_line_error(cli("train", *args, "--output", str(tmp_path)), *needles)
    assert not any(tmp_path.iterdir())  # nothing was written


def test_bad_recipe_file_is_one_line(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: tiny\ntrain: {lr: [1, 2\n")
    _one_line_error(cli("train", str(bad), "--output", str(tmp_path / "runs")), "bad.yaml", "not valid YAML")
    other = tmp_path / "other.yaml"
    other.write_text("extends: tiny\ntrain:\n  warmup_steps: -1\n")
    _one_line_error(cli("train", str(other)), "train.warmup_steps: -1 is below the minimum")


@pytest.mark.parametrize("name", ["../escape", "/tmp/escape", "a/b", ".."])
def test_a_recipe_name_with_a_path_in_it_is_refused(cli, tmp_path, name):
    """The run folder is OUTPUT/NAME: a path in the name would put it (and what --resume never deletes) elsewhere."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(f"extends: tiny\nname: {json.dumps(name)}\n")
    _one_line_error(cli("train", str(recipe), "--mock-data", "--output", str(tmp_path / "runs"), "--dry-run"),
                    f"name: {name!r}: a run name is one folder name", "--run NAME")  # fmt: skip
    assert not (tmp_path / "runs").exists()


def test_dry_run_prints_the_plan_and_writes_nothing(cli, tmp_path):
    result = cli("train", "1b-gdn-pure", "--mock-data", "--max-steps", "20", "--output", str(tmp_path), "--dry-run",
                 "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert (plan["world_size"], plan["micro_batch"], plan["accumulation"], plan["global_batch"]) == (
        1,
        8,
        56,
        448,
    )
    assert plan["max_steps"] == 20 and plan["tokens_per_step"] == 448 * 2048
    assert plan["run_dir"] == str(tmp_path / "1b-gdn-pure")
    assert not any(tmp_path.iterdir())

    two = json.loads(cli("train", "tiny", "--nproc", "2", "--data", "@sample", "--dry-run", "--json").stdout)
    assert (two["world_size"], two["micro_batch"], two["accumulation"]) == (2, 4, 1)
    assert two["data"][0].endswith(":1.0") and "sample" in two["data"][0]

    table = cli("train", "tiny", "--mock-data", "--run", "x", "--output", str(tmp_path), "--dry-run")
    assert "8 micro x 1 rank(s) x 1 accumulation = 8 sequences x 256 tokens" in table.stdout


def test_a_dry_run_leaves_the_sample_untokenized_and_a_run_tokenizes_it_there(cli, tmp_path, monkeypatch):
    """--dry-run of a recipe on @sample plans its prefix (and checks data.split against its document count) in an
    empty cache without writing a byte there; the first real run tokenizes it under that very prefix."""
    from zebra.data.bundled_corpus import NUM_DOCUMENTS
    from zebra.data.manifest import read_manifest

    from .helpers import sets

    cache, runs = tmp_path / "cache", tmp_path / "runs"
    monkeypatch.setenv("ZEBRA_CACHE", str(cache))

    def plan(*args: str):
        return cli("train", "tiny", "--dry-run", "--output", str(runs), *args)

    planned = plan("--json")
    assert planned.exit_code == 0, planned.output
    [data] = json.loads(planned.stdout)["data"]
    prefix = Path(data.removesuffix(":1.0"))
    assert prefix.parent.parent == cache.resolve() / "sample" and prefix.name.startswith("byte-")
    assert f"{prefix}:1.0" in plan().stdout  # the table names it too
    split = plan("--set", "data.split=99999,1,0")  # a validation part of round(3000 x 1e-5) = 0 documents
    _one_line_error(split, f"no documents for validation in {prefix} ({NUM_DOCUMENTS} documents)")
    assert not cache.exists() and not runs.exists()

    trained = cli("train", "tiny", "--max-steps", "1", "--output", str(runs), *sets())
    assert trained.exit_code == 0, trained.output
    assert read_manifest(prefix.parent).complete and Path(f"{prefix}.bin").is_file()
    assert json.loads(plan("--json").stdout)["data"] == [data]
    assert plan("--set", "data.split=99999,1,0").stderr == split.stderr  # now counted in the .idx


def test_resume_never_asks_before_deleting_an_earlier_run(cli, tmp_path):
    run = tmp_path / "tiny"
    (run / "checkpoints" / "step_0000001").mkdir(parents=True)
    _one_line_error(cli("train", "tiny", "--mock-data", "--output", str(tmp_path), "--resume", "never"),
                    "holds an earlier run", "--yes")  # fmt: skip
    assert (run / "checkpoints" / "step_0000001").is_dir()


def test_a_run_in_progress_is_told_as_one_not_as_an_earlier_runs_results(cli, tmp_path, hold_folder):
    """A run that has logged metrics but saved no checkpoint yet is in progress, not an earlier run's leftovers:
    a second start names the process that holds it (the results question comes only with the lock in hand)."""
    run = tmp_path / "tiny"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    pid = hold_folder(run)
    _one_line_error(cli("train", "tiny", "--mock-data", "--output", str(tmp_path)), f"in use by pid {pid}")
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "loss": 5.0}\n'


def test_plot_draws_and_compares_runs(cli, tmp_path):
    from zebra.train.metrics import MetricsLog

    for name, scale in (("a", 1.0), ("b", 0.8)):
        (tmp_path / name).mkdir()
        log = MetricsLog(tmp_path / name, resume_step=0, config={}, run_name=name)
        for step in range(1, 11):
            log.write({"step": step, "loss": scale * 5 / step})
        log.write({"step": 10, "val_loss": scale})
        log.close()
    one = cli("plot", str(tmp_path / "a"))
    assert one.exit_code == 0, one.output
    assert (tmp_path / "a" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    both = cli("plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "cmp.png"), "--log")
    assert both.exit_code == 0 and (tmp_path / "cmp.png").stat().st_size > 1000
    _one_line_error(cli("plot", str(tmp_path / "nothing")), "no training loss logged")
    _one_line_error(cli("plot", str(tmp_path / "a"), "-o", str(tmp_path / "b")), "b: is a folder", "loss.png")
    svg = cli("plot", str(tmp_path / "a"), "-o", str(tmp_path / "a.svg"))  # the format follows the suffix
    assert svg.exit_code == 0 and (tmp_path / "a.svg").read_text().lstrip().startswith("<?xml")
    assert not list(tmp_path.glob(".*tmp*")) and not list(Path.cwd().glob(".*.tmp.*"))
