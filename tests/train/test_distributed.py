"""Several CPU ranks (gloo, through torch's elastic agent): the same global batch gives the same losses as one
rank, with DDP and with FSDP2, and an FSDP2 checkpoint of two ranks resumes on one (resharding)."""

from __future__ import annotations

import pytest

from zebra.folders.checkpoint_dir import read_meta

from .helpers import losses, sets


def _train(cli, data, out, run, *extra: str):
    result = cli("train", "tiny-gdn", "--data", data, "--max-steps", "6", "--output", str(out), "--run", run,
                 *sets("train.save_interval=3", "train.eval_interval=3", "train.eval_steps=1"), *extra)  # fmt: skip
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, sample_prefix):
    from typer.testing import CliRunner

    from zebra.cli.main import app

    out = tmp_path_factory.mktemp("runs")
    _train(lambda *a: CliRunner().invoke(app, list(a)), sample_prefix, out, "one")
    return out / "one"


def _close(a: dict[int, float], b: dict[int, float]) -> None:
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5), step


def test_two_gloo_ranks_match_one_rank(cli, tmp_path, sample_prefix, one_rank):
    _train(cli, sample_prefix, tmp_path, "two", "--nproc", "2")
    meta = read_meta(tmp_path / "two" / "checkpoints" / "step_0000006")
    assert (meta["world_size"], meta["parallel"]) == (2, "ddp")
    _close(losses(tmp_path / "two"), losses(one_rank))
    val = [
        line for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines() if "val_loss" in line
    ]
    assert len(val) == 2


def test_fsdp_two_ranks_match_and_reshard_to_one(cli, tmp_path, sample_prefix, one_rank):
    _train(cli, sample_prefix, tmp_path, "fsdp", "--nproc", "2", "--set", "train.parallel=fsdp")
    run = tmp_path / "fsdp"
    assert read_meta(run / "checkpoints" / "step_0000006")["parallel"] == "fsdp"
    _close(losses(run), losses(one_rank))
    shards = sorted(p.name for p in (run / "checkpoints" / "step_0000003").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]

    resumed = _train(
        cli, sample_prefix, tmp_path, "reshard", "--resume", str(run / "checkpoints" / "step_0000003")
    )
    assert "resumed from" in resumed.output
    got = losses(tmp_path / "reshard")
    assert sorted(got) == [4, 5, 6]
    for step in (4, 5, 6):
        assert got[step] == pytest.approx(losses(one_rank)[step], rel=1e-5)


def test_sigusr1_to_the_launcher_reaches_every_rank_which_save_and_exit_zero(tmp_path, sample_prefix):
    """Slurm's pre-emption warning (SIGUSR1) sent to `zebra train --nproc 2`: the elastic agent forwards it, the
    ranks agree on the step, save one checkpoint together and the command exits 0."""
    import signal

    from zebra.folders.checkpoint_dir import committed

    from .helpers import logged_step, wait_for, zebra_process

    run = tmp_path / "tiny-mamba"
    proc = zebra_process("train", "tiny-mamba", "--nproc", "2", "--data", sample_prefix, "--max-steps", "5000",
                         "--output", str(tmp_path), *sets())  # fmt: skip
    wait_for(lambda: logged_step(run) >= 3, proc)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "stopped by SIGUSR1" in out
    (newest,) = committed(run / "checkpoints")
    meta = read_meta(newest)
    assert meta["world_size"] == 2 and 3 <= meta["step"] < 5000
    assert sorted(p.name for p in newest.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
