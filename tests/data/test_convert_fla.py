"""`convert-fla`: FLA's preprocessed Arrow chunks -> Megatron, one chunk per document, order kept, verified."""

from __future__ import annotations

from itertools import chain

import numpy as np
import pytest

from zebra.core.errors import ZebraError
from zebra.data.fla_dataset import convert_fla, fla_arrow_files, verify_against_arrow
from zebra.data.manifest import read_manifest
from zebra.data.prefixes import resolve_prefixes

from .helpers import read_all

SEQ_LEN = 64


def fla_chunks(texts, tokenizer_dir) -> list[list[int]]:
    """What FLA's preprocess produces: shuffle(seed=42), tokenize, concatenate without EOD, cut SEQ_LEN chunks."""
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    shuffled = datasets.Dataset.from_dict({"text": texts}).shuffle(seed=42)
    stream = list(chain.from_iterable(tok(list(shuffled["text"]))["input_ids"]))
    return [stream[i : i + SEQ_LEN] for i in range(0, len(stream) // SEQ_LEN * SEQ_LEN, SEQ_LEN)]


@pytest.fixture(scope="module")
def chunks(texts, bpe_dir) -> list[list[int]]:
    return fla_chunks(texts, bpe_dir)


@pytest.fixture
def fla_dir(chunks, tmp_path):
    import datasets

    path = tmp_path / "fla" / "train"
    datasets.Dataset.from_dict({"input_ids": chunks}).save_to_disk(str(path), num_shards=3)
    return path


def test_convert_keeps_every_chunk_in_order(chunks, fla_dir, bpe_dir, tmp_path):
    calls = []
    result = convert_fla(
        fla_dir,
        tmp_path / "out",
        tokenizer=str(bpe_dir),
        rows_per_shard=100,
        on_progress=lambda done, total, **counts: calls.append((done, total, counts)),
    )
    assert calls[-1] == (len(chunks), len(chunks), {"tok": len(chunks) * SEQ_LEN})
    assert result.shards_written == len(result.manifest.shards) and result.shards_kept == 0
    assert len(chunks) > 300
    assert read_all(tmp_path / "out") == chunks  # no EOD added: a chunk is a document
    m = read_manifest(tmp_path / "out")
    assert m.complete and len(m.shards) == -(-len(chunks) // 100) and m.documents == len(chunks)
    assert result.verified_tokens == len(chunks) * SEQ_LEN == m.tokens
    assert m.dtype == "uint16" and m.tokenizer["vocab_size"] == 600
    assert sum(w for _, w in resolve_prefixes(str(tmp_path / "out"))) == pytest.approx(1.0)


def test_dataset_dict_layout_and_dtype_from_data(chunks, tmp_path):
    import datasets

    big = [[c[0] + 70_000, *c[1:]] for c in chunks[:5]]  # ids beyond uint16: int32 without a tokenizer
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": big})}).save_to_disk(
        str(tmp_path / "dd")
    )
    convert_fla(tmp_path / "dd", tmp_path / "out")
    assert read_all(tmp_path / "out") == big
    assert read_manifest(tmp_path / "out").dtype == "int32"


def test_split_of_a_plain_dataset_is_one_line_error(chunks, fla_dir, tmp_path):
    import datasets

    with pytest.raises(ZebraError, match=r"--split test: .* is a plain Dataset, not a DatasetDict") as e:
        convert_fla(fla_dir, tmp_path / "out", split="test")
    assert e.value.fix == "leave --split out: the whole Dataset is converted"
    assert not (tmp_path / "out").exists()

    rows = {"train": chunks[:3], "validation": chunks[3:5]}
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict({"input_ids": v}) for k, v in rows.items()})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ZebraError, match="--split validation: ") as e:
        convert_fla(tmp_path / "dd" / "train", tmp_path / "out", split="validation")
    assert f"the DatasetDict folder {tmp_path / 'dd'} with --split (it has train, validation)" in e.value.fix
    convert_fla(tmp_path / "dd", tmp_path / "out", split="validation")
    assert read_all(tmp_path / "out") == rows["validation"]
    convert_fla(tmp_path / "dd" / "train", tmp_path / "train")  # a split folder itself, without --split
    assert read_all(tmp_path / "train") == rows["train"]


def test_rerun_resumes_and_detects_a_corrupt_shard(chunks, fla_dir, tmp_path):
    convert_fla(fla_dir, tmp_path / "out", rows_per_shard=200)
    again = convert_fla(fla_dir, tmp_path / "out", rows_per_shard=200)
    m = read_manifest(tmp_path / "out")
    assert again.shards_written == 0 and again.shards_kept == len(m.shards) and again.manifest.complete
    data = tmp_path / "out" / f"{m.shards[1].prefix}.bin"
    tokens = np.fromfile(data, dtype=np.uint16)
    tokens[3 * SEQ_LEN + 5] ^= 1  # same size, one token of the shard's 4th chunk changed
    tokens.tofile(data)
    with pytest.raises(ZebraError, match=r"document 203 differs from Arrow row 203"):
        verify_against_arrow(tmp_path / "out", fla_arrow_files(fla_dir))


def test_not_fla_data_is_one_line_error(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["raw text"]}).save_to_disk(str(tmp_path / "raw"))
    with pytest.raises(ZebraError, match=r"no 'input_ids' column \(has text\)") as e:
        convert_fla(tmp_path / "raw", tmp_path / "out")
    assert "zebra data prep" in e.value.fix
    with pytest.raises(ZebraError, match="no such folder"):
        convert_fla(tmp_path / "missing", tmp_path / "out")


def test_tokenizer_smaller_than_the_data_is_one_line_error(chunks, fla_dir, tmp_path):
    with pytest.raises(ZebraError, match=r"outside the 259-id vocabulary of byte"):
        convert_fla(fla_dir, tmp_path / "out", tokenizer="byte")
