"""Training data through megatron-core: a fixed order from the seed, ranks that split each global batch exactly,
weighted blends of prefixes, and megatron's mock dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zebra.core.errors import ZebraError
from zebra.recipes import load_recipe
from zebra.train.data import RankBatchSampler, batch_plan, build_datasets, micro_batches, split_bounds
from zebra.train.dist import DistEnv


def _env(rank: int = 0, world: int = 1) -> DistEnv:
    import torch

    return DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"))


@pytest.mark.parametrize(
    ("global_batch", "micro", "world", "expected"),
    [(448, 8, 1, (8, 56)), (448, 8, 8, (8, 7)), (16, 16, 2, (8, 1)), (12, 8, 1, (6, 2)), (8, 8, 8, (1, 1))],
)
def test_batch_plan_reaches_the_global_batch(global_batch, micro, world, expected):
    micro_used, accumulation = batch_plan(global_batch, micro, world)
    assert (micro_used, accumulation) == expected
    assert micro_used * world * accumulation == global_batch


def test_batch_plan_refuses_an_uneven_split():
    with pytest.raises(ZebraError, match="does not split over 3 ranks"):
        batch_plan(16, 4, 3)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_split_every_global_batch_exactly(world):
    micro, accumulation = batch_plan(16, 4, world)
    per_rank = [
        list(RankBatchSampler(start=32, stop=96, global_batch=16, micro_batch=micro, rank=r, world=world))
        for r in range(world)
    ]
    for r in range(world):
        assert len(per_rank[r]) == 4 * accumulation  # 4 steps between samples 32 and 96
    for step in range(4):
        got = sorted(i for r in range(world) for mb in per_rank[r][step * accumulation : (step + 1) * accumulation]
                     for i in mb)  # fmt: skip
        assert got == list(range(32 + 16 * step, 48 + 16 * step))


def _first_batches(recipe, tmp_path, n: int = 3):
    train, valid = build_datasets(recipe, train_samples=64, valid_samples=8, cache_dir=tmp_path)
    it = micro_batches(train, start=0, stop=64, global_batch=8, micro_batch=8, env=_env(), num_workers=0)
    return [next(it) for _ in range(n)], valid


def test_same_seed_same_batches_other_seed_other_batches(tmp_path, sample_prefix):
    recipe = load_recipe("tiny", overrides=[f"data.paths={sample_prefix}", "data.seq_len=32"])
    a, valid = _first_batches(recipe, tmp_path / "a")
    b, _ = _first_batches(recipe, tmp_path / "b")
    for x, y in zip(a, b, strict=True):
        assert x["tokens"].equal(y["tokens"]) and x["labels"].equal(y["labels"])
    assert a[0]["tokens"].shape == (8, 32)
    assert a[0]["labels"][:, :-1].equal(a[0]["tokens"][:, 1:])  # labels are the next tokens
    assert valid is not None and len(valid) >= 8
    other = load_recipe("tiny", overrides=[f"data.paths={sample_prefix}", "data.seq_len=32", "train.seed=7"])
    c, _ = _first_batches(other, tmp_path / "c")
    assert not c[0]["tokens"].equal(a[0]["tokens"])


def _write_prefix(path, token: int, docs: int = 200) -> str:
    """A Megatron prefix whose documents hold only `token` (then EOD 256), written by megatron-core itself."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(path) + ".bin", dtype=np.uint16)
    rng = np.random.default_rng(token)
    for _ in range(docs):
        n = int(rng.integers(20, 60))
        builder.add_document(torch.tensor([token] * n + [256]), [n + 1])
    builder.finalize(str(path) + ".idx")
    return str(path)


def test_weighted_data_paths_reach_megatrons_blend_from_the_command_line(cli, tmp_path):
    """`zebra train --data A:3 --data B:1`, B in a folder whose name holds ':': the plan shows each resolved
    prefix with its weight, the run's config.yaml keeps them so (what a resumed run reads), and the rank's
    datasets, built from that config.yaml, blend the two prefixes 3:1."""
    from zebra.recipes.loader import combine, parse_assignments
    from zebra.train.run import RankLayout, data_overrides, prepare_run, resolve_run

    (tmp_path / "x:y").mkdir()
    a, b = _write_prefix(tmp_path / "a", ord("a")), _write_prefix(tmp_path / "x:y" / "b", ord("b"))
    sets = ["data.seq_len=16", "data.split=90,10,0"]
    flags = [x for s in sets for x in ("--set", s)]
    result = cli("train", "tiny", "--data", f"{a}:3", "--data", f"{b}:1", *flags, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["data"] == [f"{a}:3.0", f"{b}:1.0"]

    overrides = combine(parse_assignments(sets), data_overrides([f"{a}:3", f"{b}:1"], False, None))
    run = resolve_run(load_recipe("tiny", overrides), RankLayout("cpu", 1, 1), output=tmp_path / "runs")
    config = prepare_run(run) / "config.yaml"
    assert f"- {b}:1.0" in config.read_text()
    recipe = load_recipe(config)
    assert recipe.data.paths == [(a, 3.0), (b, 1.0)]
    train, _ = build_datasets(recipe, train_samples=400, valid_samples=16, cache_dir=tmp_path / "cache")
    sources = [int(train[i]["dataset_id"]) for i in range(400)]
    assert abs(sources.count(0) / 400 - 0.75) < 0.02
    assert set(train[sources.index(1)]["tokens"].tolist()) - {256} == {ord("b")}


def test_blend_of_two_prefixes_follows_the_weights(tmp_path):
    a = _write_prefix(tmp_path / "a", ord("a"))
    b = _write_prefix(tmp_path / "b", ord("b"))
    recipe = load_recipe(
        "tiny", overrides=[f"data.paths={a}:3,{b}:1", "data.seq_len=16", "data.split=90,10,0"]
    )
    train, valid = build_datasets(recipe, train_samples=400, valid_samples=16, cache_dir=tmp_path / "cache")
    sources = [int(train[i]["dataset_id"]) for i in range(400)]
    assert abs(sources.count(0) / 400 - 0.75) < 0.02
    for i in range(40):
        sample = train[i]
        letters = set(sample["tokens"].tolist()) - {256}
        assert letters == {ord("a") if sample["dataset_id"] == 0 else ord("b")}
    assert valid is not None


def test_missing_prefix_is_a_one_line_error(tmp_path):
    recipe = load_recipe("tiny", overrides=[f"data.paths={tmp_path / 'nothing'}"])
    with pytest.raises(ZebraError, match=r"nothing\.bin not found"):
        build_datasets(recipe, train_samples=8, valid_samples=0, cache_dir=tmp_path)


def test_a_split_without_training_documents_is_a_one_line_error(tmp_path):
    a = _write_prefix(tmp_path / "a", ord("a"), docs=20)
    recipe = load_recipe("tiny", overrides=[f"data.paths={a}", "data.split=0,1,0"])
    with pytest.raises(ZebraError, match="leaves no documents for training"):
        build_datasets(recipe, train_samples=8, valid_samples=0, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("split", ["99,1,0", "969,30,1", "0,1,0", "100,0,0", "1,1,1", "0.7,0.2,0.1"])
def test_split_bounds_are_megatrons_split_matrix(split):
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    theirs = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    ours = split_bounds(split)
    assert [b is None for b in ours] == [b is None for b in theirs]
    flat = [x for b in ours if b for x in b]
    assert flat == pytest.approx([x for b in theirs if b for x in b], abs=1e-12)


@pytest.mark.timeout(120)  # megatron drew samples from an empty validation split forever
@pytest.mark.parametrize("valid_samples, fix", [(8, "data.split=90,10,0"), (0, "data.split=100,0,0")])
def test_a_split_without_validation_documents_is_refused_not_a_hang(tmp_path, valid_samples, fix):
    a = _write_prefix(tmp_path / "a", ord("a"), docs=40)  # 99,1,0 cuts 40 documents at round(39.6) = 40
    recipe = load_recipe("tiny", overrides=[f"data.paths={a}", "data.split=99,1,0"])
    with pytest.raises(ZebraError, match="leaves no documents for validation") as error:
        build_datasets(recipe, train_samples=8, valid_samples=valid_samples, cache_dir=tmp_path / "cache")
    assert fix in error.value.fix


@pytest.mark.parametrize("docs, split, valid_samples", [(1, "100,0,0", 0), (5, "90,10,0", 4)])
def test_the_split_check_counts_every_document(tmp_path, docs, split, valid_samples):
    """At the edge: one document trains with 100,0,0; five cut by 90,10,0 at round(4.5) = 4 leave validation one
    (megatron's own cut), so both build."""
    a = _write_prefix(tmp_path / "a", ord("a"), docs=docs)
    recipe = load_recipe("tiny", overrides=[f"data.paths={a}", f"data.split={split}", "data.seq_len=8"])
    train, valid = build_datasets(
        recipe, train_samples=8, valid_samples=valid_samples, cache_dir=tmp_path / "c"
    )
    assert len(train) >= 8
    if valid_samples:
        assert valid is not None and len(valid) >= valid_samples


def test_a_split_with_validation_documents_builds_both(tmp_path):
    a = _write_prefix(tmp_path / "a", ord("a"), docs=40)
    recipe = load_recipe("tiny", overrides=[f"data.paths={a}", "data.split=90,10,0", "data.seq_len=8"])
    train, valid = build_datasets(recipe, train_samples=8, valid_samples=4, cache_dir=tmp_path / "cache")
    assert len(train) >= 8 and valid is not None and len(valid) >= 4


def test_mock_data_is_megatrons_counting_documents(tmp_path):
    recipe = load_recipe("tiny", overrides=["data.mock=true", "data.seq_len=64"])
    batches, valid = _first_batches(recipe, tmp_path)
    tokens = batches[0]["tokens"]  # [8, 64]: each document counts 1, 2, 3, ... then EOD (0)
    steps = tokens[:, 1:] - tokens[:, :-1]
    assert ((steps == 1) | (tokens[:, 1:] == 0) | (tokens[:, :-1] == 0)).all()
    assert valid is not None


def test_mock_data_trains_through_the_cli(cli, tmp_path):
    from .helpers import losses, sets

    result = cli("train", "tiny-mamba", "--mock-data", "--max-steps", "3", "--output", str(tmp_path), *sets())
    assert result.exit_code == 0, result.output
    assert sorted(losses(tmp_path / "tiny-mamba")) == [1, 2, 3]
    assert (
        "data:\n  tokenizer: byte\n  paths: []\n  mock: true"
        in (tmp_path / "tiny-mamba" / "config.yaml").read_text()
    )
