"""`data.order: fla` through `zebra train`: a run on a convert-fla folder trains, and a run stopped and resumed
reads the same chunks in the same order as an uninterrupted one (the same losses, step for step)."""

from __future__ import annotations

import pytest

from .helpers import losses, sets, write_fla_folder

SEQ = 32


@pytest.fixture(scope="module")
def fla_folder(tmp_path_factory):
    return write_fla_folder(tmp_path_factory.mktemp("fla"), SEQ)


def _train(cli, data, out, run: str, steps: int):
    args = ["train", "tiny-gdn", "--data", str(data), "--max-steps", str(steps), "--output", str(out), "--run", run,
            *sets("data.order=fla", f"data.seq_len={SEQ}", "train.lr_decay_style=constant", "train.save_interval=3")]  # fmt: skip
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return out / run, result.output


def test_a_resumed_fla_order_run_matches_the_uninterrupted_one(cli, tmp_path, fla_folder):
    whole = losses(_train(cli, fla_folder, tmp_path, "whole", 6)[0])
    assert sorted(whole) == list(range(1, 7)) and whole[6] < whole[1]
    _train(cli, fla_folder, tmp_path, "resumed", 3)
    run, output = _train(cli, fla_folder, tmp_path, "resumed", 6)
    assert "resumed from" in output and "(step 3," in output
    resumed = losses(run)
    for step in range(1, 7):
        assert resumed[step] == pytest.approx(whole[step], rel=1e-5, abs=1e-6), step
