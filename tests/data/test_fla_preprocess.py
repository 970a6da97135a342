"""FLA's preprocessing, offline (`zebra.data.fla_preprocess`): shuffle(seed=42), tokenize, concatenate without EOD
per map batch, cut into seq_len chunks; the result is what convert-fla reads."""

from __future__ import annotations

from itertools import chain

import pytest

from zebra.core.errors import ZebraError
from zebra.data.fla_dataset import convert_fla
from zebra.data.fla_preprocess import MAP_BATCH, fla_preprocess

from .helpers import read_all, write_source
from .test_convert_fla import SEQ_LEN, fla_chunks


def test_chunks_are_flas_and_convert_fla_reads_them(texts, bpe_dir, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    result = fla_preprocess(source, str(bpe_dir), tmp_path / "arrow", seq_len=SEQ_LEN)
    expected = fla_chunks(texts, bpe_dir)  # the recipe written out with datasets + transformers directly
    assert (result.documents, result.chunks, result.tokens) == (
        len(texts),
        len(expected),
        len(expected) * SEQ_LEN,
    )
    convert_fla(tmp_path / "arrow", tmp_path / "chunks", tokenizer=str(bpe_dir))
    assert read_all(tmp_path / "chunks") == expected
    assert not list(tmp_path.glob(".arrow.tmp*"))


def test_each_map_batch_drops_its_own_remainder(tmp_path):
    import datasets

    docs = [f"document {i}: " + "abc " * (i % 7) for i in range(MAP_BATCH + 300)]
    source = write_source("jsonl", tmp_path / "src", docs)
    fla_preprocess(source, "byte", tmp_path / "arrow", seq_len=16)
    shuffled = datasets.Dataset.from_dict({"text": docs}).shuffle(seed=42)["text"]
    expected = []
    for lo in (0, MAP_BATCH):  # two map batches, each concatenated and cut on its own
        stream = list(chain.from_iterable(t.encode() for t in shuffled[lo : lo + MAP_BATCH]))
        expected += [stream[i : i + 16] for i in range(0, len(stream) // 16 * 16, 16)]
    got = datasets.load_from_disk(str(tmp_path / "arrow"))["input_ids"]
    assert got == expected


def test_bad_input_is_refused(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts[:3])
    with pytest.raises(ZebraError, match="fewer than 100000 tokens"):
        fla_preprocess(source, "byte", tmp_path / "arrow", seq_len=100_000)
    (tmp_path / "exists").mkdir()
    with pytest.raises(ZebraError, match="already exists"):
        fla_preprocess(source, "byte", tmp_path / "exists")
    with pytest.raises(ZebraError, match="not a local file"):
        fla_preprocess("owner/corpus", "byte", tmp_path / "hub")
