"""`inspect_data`: counts, histogram, decoded sample, tokenizer check, and truncation detection."""

from __future__ import annotations

import pytest

from zebra.data.inspection import inspect_data
from zebra.data.prep import plan_prep, run_prep
from zebra.data.text_sources import open_source
from zebra.errors import ZebraError

from .helpers import expected_ids, write_source


@pytest.fixture
def folder(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    run_prep(plan_prep(open_source(str(source)), tmp_path / "out", tokenizer="byte", shards=2, workers=2))
    return tmp_path / "out"


def test_report_matches_the_data(folder, texts):
    want = expected_ids("byte", texts)
    r = inspect_data(str(folder), samples=2, sample_chars=30)
    assert (r["documents"], r["tokens"], r["dtype"], r["complete"]) == (
        len(texts),
        sum(map(len, want)),
        "uint16",
        True,
    )
    assert sum(b["count"] for b in r["histogram"]) == len(texts)
    for b in r["histogram"]:
        assert b["count"] == sum(b["lo"] <= len(w) <= b["hi"] for w in want)
    assert r["lengths"]["max"] == max(map(len, want)) and r["lengths"]["min"] == min(map(len, want))
    assert r["tokenizer_check"]["status"] == "ok"
    assert [s["text"] for s in r["samples"]] == [(t + "<|endoftext|>")[:30] for t in texts[:2]]
    assert r["samples"][0]["ids"] == want[0][:16]


def test_plain_prefix_and_tokenizer_mismatch(folder, bpe_dir, texts):
    prefix = next(folder.glob("*_00001.idx")).with_suffix("")
    r = inspect_data(str(prefix), tokenizer="byte")
    assert r["documents"] == len(texts) - len(texts) // 2 and r["tokenizer_check"]["status"] == "unchecked"
    mismatch = inspect_data(str(folder), tokenizer=str(bpe_dir))
    assert mismatch["tokenizer_check"]["status"] == "mismatch"


@pytest.mark.parametrize(("ext", "cut"), [("bin", 1), ("idx", 9)])
def test_truncated_files_are_errors(folder, ext, cut):
    path = next(folder.glob(f"*_00001.{ext}"))
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(ZebraError, match=rf"{path.name}: truncated"):
        inspect_data(str(folder))


def test_checksums(folder):
    assert inspect_data(str(folder), checksums=True)["documents"] > 0
    path = next(folder.glob("*_00000.bin"))
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ZebraError, match=r"\.bin: sha256 differs from manifest\.json"):
        inspect_data(str(folder), checksums=True)
