"""`data.order: fla`: each sample is one of FLA's chunks, and every rank reads the chunk FLA's legacy trainer reads
there. The reference is built from the real pieces FLA's trainer runs: `datasets`' shuffle(seed=42), torch's
`DistributedSampler(seed=42)` and a DataLoader of micro-batches, with A of them accumulated per step."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app
from zebra.data.fla_order import FlaOrder
from zebra.recipes import load_recipe
from zebra.train.data import build_datasets, fla_dataset, micro_batches
from zebra.train.dist import DistEnv
from zebra.train.run import resolve_data

from .helpers import write_fla_data

SEQ = 8
N = 37  # chunks: no multiple of any rank count or batch, so the sampler pads and epochs end mid-batch


def _chunk(row: int) -> list[int]:
    return list(range(row * SEQ, (row + 1) * SEQ))  # the row can be read off any of its tokens


@pytest.fixture(scope="module")
def fla_data(tmp_path_factory):
    return write_fla_data(tmp_path_factory.mktemp("fla"), [_chunk(i) for i in range(N)], rows_per_shard=10)


def _env(rank: int, world: int) -> DistEnv:
    import torch

    return DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"))


def _recipe(folder, global_batch: int, micro: int, *extra: str):
    return load_recipe(
        "tiny",
        overrides=[
            f"data.paths={folder}",
            "data.order=fla",
            f"data.seq_len={SEQ}",
            f"train.global_batch_size={global_batch}",
            f"train.micro_batch_size={micro}",
            *extra,
        ],
    )


def fla_reads(
    arrow, ranks: int, micro: int, accumulation: int, epoch: int = 0
) -> list[list[list[list[int]]]]:
    """FLA's legacy trainer: `[step][rank][micro-batch]` -> the chunks (lists of ids), whole steps only."""
    import datasets
    from torch.utils.data import DataLoader, DistributedSampler

    ds = datasets.load_from_disk(str(arrow)).shuffle(seed=42)
    per_rank = []
    for r in range(ranks):
        sampler = DistributedSampler(ds, num_replicas=ranks, rank=r, shuffle=True, seed=42)
        sampler.set_epoch(epoch)
        loader = DataLoader(
            ds, batch_size=micro, sampler=sampler, collate_fn=lambda b: [x["input_ids"] for x in b]
        )
        per_rank.append([batch for batch in loader if len(batch) == micro])
    steps = min(len(batches) for batches in per_rank) // accumulation
    return [
        [per_rank[r][s * accumulation : (s + 1) * accumulation] for r in range(ranks)] for s in range(steps)
    ]


def zebra_reads(folder, ranks: int, micro: int, accumulation: int, start_step: int, steps: int):
    """The trainer's micro-batches, `[step][rank][micro-batch]` -> tokens (lists of ids)."""
    G = micro * ranks * accumulation
    recipe = _recipe(folder, G, micro)
    dataset = fla_dataset(recipe, (start_step + steps) * G, ranks=ranks)
    out = [[[] for _ in range(ranks)] for _ in range(steps)]
    for r in range(ranks):
        it = micro_batches(dataset, start=start_step * G, stop=(start_step + steps) * G, global_batch=G,
                           micro_batch=micro, env=_env(r, ranks), num_workers=0)  # fmt: skip
        for s in range(steps):
            for _ in range(accumulation):
                out[s][r].append(next(it)["tokens"].tolist())
    return out


CASES = [(1, 4, 1), (1, 2, 3), (2, 2, 2), (2, 3, 1), (4, 1, 3), (4, 2, 1)]  # (ranks, micro, accumulation)


@pytest.mark.parametrize(
    ("ranks", "micro", "accumulation"), CASES, ids=[f"D{d}-M{m}-A{a}" for d, m, a in CASES]
)
def test_every_rank_reads_flas_chunks_for_a_whole_epoch(fla_data, ranks, micro, accumulation):
    arrow, folder = fla_data
    expected = fla_reads(arrow, ranks, micro, accumulation)
    assert len(expected) == FlaOrder(N, ranks, micro, accumulation).steps_per_epoch > 0
    assert zebra_reads(folder, ranks, micro, accumulation, 0, len(expected)) == expected


@pytest.mark.parametrize(("ranks", "micro", "accumulation"), [(1, 4, 1), (2, 2, 2), (4, 1, 3)])
def test_the_next_epoch_uses_the_samplers_next_seed(fla_data, ranks, micro, accumulation):
    arrow, folder = fla_data
    per_epoch = FlaOrder(N, ranks, micro, accumulation).steps_per_epoch
    second = fla_reads(arrow, ranks, micro, accumulation, epoch=1)
    assert second != fla_reads(arrow, ranks, micro, accumulation, epoch=0)
    assert zebra_reads(folder, ranks, micro, accumulation, per_epoch, 2) == second[:2]


@pytest.mark.parametrize(("ranks", "micro", "accumulation"), [(1, 2, 2), (2, 2, 1), (4, 1, 2)])
def test_a_resumed_run_continues_the_same_order(fla_data, ranks, micro, accumulation):
    _, folder = fla_data
    steps = FlaOrder(N, ranks, micro, accumulation).steps_per_epoch + 2  # the resume crosses an epoch
    whole = zebra_reads(folder, ranks, micro, accumulation, 0, steps)
    assert zebra_reads(folder, ranks, micro, accumulation, 3, steps - 3) == whole[3:]


def test_a_sample_is_one_chunk_with_next_token_labels_inside_it(texts, bpe_dir, tmp_path):
    from .test_convert_fla import SEQ_LEN, fla_chunks

    chunks = fla_chunks(texts, bpe_dir)  # real text: FLA's preprocess over the test corpus
    _, folder = write_fla_data(tmp_path, chunks)
    recipe = _recipe(folder, 4, 4, f"data.seq_len={SEQ_LEN}")
    train, valid = build_datasets(recipe, train_samples=8, valid_samples=4, cache_dir=tmp_path / "cache")
    assert valid is None and len(train) == 8  # FLA trains on every chunk: no validation split
    rows = FlaOrder(len(chunks), 1, 4, 1).rows(range(8))
    for g, row in enumerate(rows.tolist()):
        sample = train[g]
        assert sample["tokens"].tolist() == chunks[row]  # the whole chunk, no EOD, no window across chunks
        assert sample["labels"][:-1].tolist() == chunks[row][1:]
        assert sample["loss_mask"].tolist() == [1.0] * (SEQ_LEN - 1) + [0.0]  # the last token has no target


def test_the_order_does_not_depend_on_the_shard_layout(tmp_path):
    chunks = [_chunk(i) for i in range(N)]
    _, one = write_fla_data(tmp_path / "one", chunks)
    _, many = write_fla_data(tmp_path / "many", chunks, rows_per_shard=7)
    assert zebra_reads(one, 2, 2, 1, 0, 4) == zebra_reads(many, 2, 2, 1, 0, 4)


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def _order(cli, folder, *args):
    return cli("data", "order", folder, "--recipe", "tiny", "--set", f"data.seq_len={SEQ}", *args)


def test_data_order_prints_flas_rows_per_rank_and_step(cli, fla_data):
    arrow, folder = fla_data
    r = _order(cli, folder, "--steps", "3", "--ranks", "2", "--set", "data.order=fla",
               "--set", "train.global_batch_size=8", "--set", "train.micro_batch_size=2", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert (report["order"], report["ranks"], report["micro_batch"], report["accumulation"]) == (
        "fla",
        2,
        2,
        2,
    )
    expected = fla_reads(arrow, 2, 2, 2)[:3]
    rows = [[[[chunk[0] // SEQ for chunk in mb] for mb in rank] for rank in step] for step in expected]
    assert report["steps"] == rows

    table = _order(cli, folder, "--steps", "1", "--set", "data.order=fla", "--set", "train.global_batch_size=4",
                   "--set", "train.micro_batch_size=4")  # fmt: skip
    assert table.exit_code == 0, table.output
    first = ", ".join(str(chunk[0] // SEQ) for chunk in fla_reads(arrow, 1, 4, 1)[0][0][0])
    assert first in table.stdout and "fla order" in table.stdout


def test_data_order_shows_the_documents_of_megatrons_windows(cli, tmp_path):
    # two shards, so megatron blends two datasets; 100 chunks each leave megatron's 1% validation split a chunk
    _, folder = write_fla_data(tmp_path / "fla", [_chunk(i) for i in range(200)], rows_per_shard=100)
    r = _order(cli, folder, "--steps", "2", "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=2",
               "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["order"] == "megatron" and report["accumulation"] == 2
    recipe = load_recipe("tiny", overrides=[f"data.paths={folder}", f"data.seq_len={SEQ}"])
    resolve_data(recipe)  # as `zebra train` does
    train, _ = build_datasets(recipe, train_samples=8, valid_samples=0, cache_dir=tmp_path)
    batches = micro_batches(
        train, start=0, stop=8, global_batch=4, micro_batch=2, env=_env(0, 1), num_workers=0
    )
    for step in report["steps"]:
        for mb in step[0]:
            got = next(batches)
            for rows, tokens, labels in zip(mb, got["tokens"].tolist(), got["labels"].tolist(), strict=True):
                window = [*tokens, labels[-1]]  # megatron's seq_len + 1 tokens
                assert sorted({t // SEQ for t in window}) == sorted(rows) and len(rows) >= 2


def _dry_run(cli, data, *extra):
    return cli("train", "tiny", "--data", data, "--dry-run", "--set", "data.order=fla", "--set", f"data.seq_len={SEQ}",
               "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=4", *extra)  # fmt: skip


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and all(n in errors[0] for n in needles), result.stderr


def test_train_plans_an_fla_order_run(cli, fla_data):
    _, folder = fla_data
    r = _dry_run(cli, folder, "--json")
    assert r.exit_code == 0, r.output


def test_bad_input_for_the_fla_order_is_one_line(cli, fla_data, texts, tmp_path):
    from .helpers import write_source

    _, folder = fla_data
    _one_line_error(
        _dry_run(cli, folder, "--set", "data.seq_len=16"), "holds 8-token chunks", "data.seq_len is 16"
    )
    _one_line_error(_dry_run(cli, "@sample"), "@sample is not FLA data")
    _one_line_error(_dry_run(cli, f"{folder}/chunks_00000"), "names some shards of")
    _one_line_error(_dry_run(cli, f"{folder}/../arrow/data"), "is not a data folder")
    _, other = write_fla_data(tmp_path / "other", [_chunk(i) for i in range(N)])
    _one_line_error(_dry_run(cli, folder, "--data", str(other)), "names 2 data sets")
    _one_line_error(
        _dry_run(cli, folder, "--set", "train.global_batch_size=64"),
        "holds 37 chunks, fewer than one global batch (64)",
    )
    source = write_source("jsonl", tmp_path / "src", texts[:20])
    prep = cli("data", "prep", "--source", source, "-t", "byte", "-o", tmp_path / "prepped")
    assert prep.exit_code == 0, prep.output
    _one_line_error(_dry_run(cli, tmp_path / "prepped"), "written by `zebra data prep`, not convert-fla")
    _one_line_error(_order(cli, tmp_path / "prepped", "--set", "data.order=fla"), "not convert-fla")
