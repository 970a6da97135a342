"""Interrupted runs: SIGKILL mid-run then `--resume auto` reproduces the uninterrupted run step for step; SIGTERM
saves a checkpoint and exits 0; a corrupted newest checkpoint falls back to the previous one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from zebra.folders.checkpoint_dir import committed, read_meta

from .helpers import logged_step, losses, sets, wait_for, zebra_process


def _args(recipe: str, data: str, out, run: str, steps: int, *overrides: str) -> list[str]:
    return ["train", recipe, "--data", data, "--max-steps", str(steps), "--output", str(out), "--run", run,
            *sets(*overrides)]  # fmt: skip


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(cli, tmp_path, sample_prefix):
    steps = 16
    ref = cli(*_args("tiny-gdn", sample_prefix, tmp_path, "ref", steps, "train.save_interval=3"))
    assert ref.exit_code == 0, ref.output

    run = tmp_path / "killed"
    proc = zebra_process(
        *_args("tiny-gdn", sample_prefix, tmp_path, "killed", steps, "train.save_interval=3")
    )
    wait_for(lambda: logged_step(run) >= 5, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = logged_step(run)
    assert killed_at < steps and not (run / "checkpoints" / f"step_{steps:07d}").exists()

    resumed = cli(*_args("tiny-gdn", sample_prefix, tmp_path, "killed", steps, "train.save_interval=3"))
    assert resumed.exit_code == 0, resumed.output
    start = int(resumed.output.split("(step ")[1].split(",")[0])
    assert 3 <= start <= killed_at and start % 3 == 0
    expected, got = losses(tmp_path / "ref"), losses(run)
    assert sorted(got) == list(range(1, steps + 1))
    for step in range(start + 1, steps + 1):
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step


def test_sigterm_saves_a_checkpoint_and_exits_zero(cli, tmp_path, sample_prefix):
    run = tmp_path / "term"
    proc = zebra_process(*_args("tiny-mamba", sample_prefix, tmp_path, "term", 500))
    wait_for(lambda: logged_step(run) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "stopped by SIGTERM" in out and "Traceback" not in err
    (newest,) = committed(run / "checkpoints")
    step = read_meta(newest)["step"]
    assert 2 <= step < 500 and logged_step(run) == step
    assert not list((run / "checkpoints").glob("*.partial"))

    more = cli(*_args("tiny-mamba", sample_prefix, tmp_path, "term", step + 2))
    assert more.exit_code == 0, more.output
    assert f"resumed from {newest}" in more.output.replace("\n", "")
    assert sorted(losses(run)) == list(range(1, step + 3))


_SIGTERM_WHILE_BUILDING = """
import os, signal, sys
from zebra.recipes import load_recipe
from zebra.train import trainer
from zebra.train.run import RankLayout, prepare_run, resolve_run

build = trainer.build_model

def build_then_terminated(*args, **kwargs):  # Slurm's pre-emption, while the model is being built
    os.kill(os.getpid(), signal.SIGTERM)
    return build(*args, **kwargs)

trainer.build_model = build_then_terminated
sets = ["data.mock=true", "data.paths=[]", "train.max_steps=50", "train.eval_interval=0"]
run = resolve_run(load_recipe("tiny", overrides=sets), RankLayout("cpu", 1, 1), output=sys.argv[1])
prepare_run(run)
result = trainer.train_rank(run.run_dir)
print("stopped_by", result.stopped_by, "step", result.step)
"""


def test_sigterm_during_start_up_stops_at_the_first_step_saved(tmp_path):
    """A SIGTERM before the loop (here while the model is built) is kept, not fatal: the rank stops after its
    first step, which it saves, and exits 0 like a SIGTERM in the loop (it used to die at once, silently)."""
    proc = subprocess.run(
        [sys.executable, "-c", _SIGTERM_WHILE_BUILDING, str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stopped_by SIGTERM step 1" in proc.stdout
    assert [p.name for p in committed(tmp_path / "tiny" / "checkpoints")] == ["step_0000001"]


def test_corrupted_newest_checkpoint_falls_back_to_the_previous_one(cli, tmp_path, sample_prefix):
    args = _args("tiny-mamba", sample_prefix, tmp_path, "c", 6, "train.save_interval=2", "train.keep_last=3")
    first = cli(*args)
    assert first.exit_code == 0, first.output
    run = tmp_path / "c"
    before = losses(run)
    assert [p.name for p in committed(run / "checkpoints")] == [
        "step_0000006",
        "step_0000004",
        "step_0000002",
    ]
    shard = run / "checkpoints" / "step_0000006" / "__0_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)

    again = cli(*args)
    assert again.exit_code == 0, again.output
    text = again.output.replace("\n", " ")
    assert "step_0000006 could not be loaded" in text and "falling back to step_0000004" in text
    after = losses(run)
    assert after[5] == pytest.approx(before[5], rel=1e-5) and after[6] == pytest.approx(before[6], rel=1e-5)
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000006"
    assert read_meta(run / "checkpoints" / "step_0000006")["step"] == 6


def test_incomplete_checkpoints_are_never_candidates(tmp_path):
    """A save that died before commit (a .partial folder, or no metadata) is not a checkpoint."""
    ck = tmp_path / "checkpoints"
    for name, files in {
        "step_0000002": [".metadata", "meta.json"],
        "step_0000004": ["meta.json"],
        "step_0000006.partial": [".metadata", "meta.json"],
    }.items():
        (ck / name).mkdir(parents=True)
        for f in files:
            (ck / name / f).write_text("{}")
    assert [p.name for p in committed(ck)] == ["step_0000002"]


def test_resume_path_into_a_run_with_outputs_asks_before_replacing_them(cli, tmp_path, sample_prefix):
    other = _args("tiny-mamba", sample_prefix, tmp_path, "other", 2)
    assert cli(*other).exit_code == 0
    args = _args("tiny-mamba", sample_prefix, tmp_path, "r", 4, "train.save_interval=2")
    assert cli(*args).exit_code == 0
    run = tmp_path / "r"
    metrics, checkpoints = (
        (run / "metrics.jsonl").read_text(),
        [p.name for p in committed(run / "checkpoints")],
    )

    refused = cli(*args, "--resume", str(tmp_path / "other"))  # no terminal, no --yes: a one-line error
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    text = " ".join(refused.stderr.split())
    assert f"{run}: holds an earlier run" in text and "--yes" in text
    assert (run / "metrics.jsonl").read_text() == metrics
    assert [p.name for p in committed(run / "checkpoints")] == checkpoints

    own = cli(*args, "--resume", str(run))  # its own newest checkpoint replaces nothing: no question
    assert own.exit_code == 0, own.output
    confirmed = cli(*args, "--resume", str(tmp_path / "other"), "--yes")
    assert confirmed.exit_code == 0, confirmed.output
    assert "resumed from " + str(tmp_path / "other") in confirmed.output.replace("\n", "")
    assert sorted(losses(run)) == [1, 2, 3, 4]


def _labelled_corpus(folder) -> str:
    """100 documents of 20 tokens, document d made of token d + 1 only, each followed by EOD (256): the tokens
    of a sample say which documents it holds."""
    import numpy as np

    from zebra.data.indexed import ShardWriter

    folder.mkdir()
    writer = ShardWriter(folder / "docs", np.uint16)
    docs = np.concatenate([np.array([d + 1] * 20 + [256], dtype=np.uint16) for d in range(100)])
    writer.add_documents(docs, np.full(100, 21))
    writer.finish()
    writer.commit()
    return str(folder / "docs")


def _samples_read(run_dir, max_steps: int, resume: str, *overrides: str) -> list[tuple[int, ...]]:
    """The training samples a run of `run_dir`'s recipe reads up to `max_steps` (from its checkpoint with auto)."""
    from zebra.recipes import load_recipe
    from zebra.train.dist import init_distributed
    from zebra.train.trainer import Trainer

    recipe = load_recipe(run_dir / "config.yaml", overrides=[f"train.max_steps={max_steps}", *overrides])
    trainer = Trainer(recipe, run_dir, init_distributed("cpu"))
    trainer.restore(resume, warn=print)
    batches, _ = trainer.open_data()
    samples: list[tuple[int, ...]] = []
    while len(samples) < (max_steps - trainer.progress.step) * recipe.train.global_batch_size:
        samples += [tuple(row) for row in next(batches)["tokens"].tolist()]
    return samples


def test_extending_a_finished_run_keeps_its_order_and_reads_unseen_samples_first(cli, tmp_path):
    """Megatron shuffles over all the epochs a sample count needs: 32 samples fit one epoch (65 samples),
    80 need two, and building the order for 80 (or for 6 steps x a global batch of 16) would reorder the first 32
    and repeat documents early."""
    from collections import Counter

    prefix = _labelled_corpus(tmp_path / "corpus")
    args = _args("tiny", prefix, tmp_path, "r", 4, "data.split=100,0,0")
    assert cli(*args).exit_code == 0
    run = tmp_path / "r"
    first = _samples_read(run, 4, "never")  # 4 steps x 8 samples, as the finished run read them
    more = _samples_read(run, 10, "auto")  # --max-steps 10 from its step-4 checkpoint: 48 more
    assert len(first) == 32 and len(more) == 48
    uninterrupted = _samples_read(run, 8, "never")  # a run of 8 steps from the start (one epoch)
    assert uninterrupted == first + more[:32]

    bigger_batch = _samples_read(run, 6, "auto", "train.global_batch_size=16")  # 2 steps x 16 from step 4
    assert bigger_batch == uninterrupted[32:]

    epoch = first + more[:33]  # the 65 samples of the first epoch: each document's 20 tokens at most once
    seen = Counter(t for sample in epoch for t in sample if t != 256)
    assert max(seen.values()) <= 20 and len(seen) >= 95


def test_a_second_run_into_a_running_run_is_refused_naming_it(cli, tmp_path, sample_prefix):
    run = tmp_path / "busy"
    proc = zebra_process(*_args("tiny-mamba", sample_prefix, tmp_path, "busy", 500))
    try:
        wait_for(lambda: logged_step(run) >= 1, proc)
        second = cli(*_args("tiny-mamba", sample_prefix, tmp_path, "busy", 500, "train.save_interval=1"))
        assert second.exit_code == 1 and "Traceback" not in second.output
        text = " ".join(second.stderr.split())
        assert f"{run}: in use by pid {proc.pid} on" in text and "--run NAME" in text
        assert not (run / "checkpoints").exists() and logged_step(run) < 500  # the first run went on alone
    finally:
        proc.kill()
        proc.wait()
