"""`inspect_data`: counts, histogram, decoded sample, tokenizer check, and truncation detection."""

from __future__ import annotations

import pytest

from zebra.core.errors import ZebraError
from zebra.data.inspection import inspect_data
from zebra.data.prep import plan_prep, run_prep
from zebra.data.text_sources import open_source

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


MALFORMED = {
    "a shard without tokens": (lambda m: m["shards"][0].pop("tokens"), "shards[0] has no 'tokens'"),
    "shards not a list": (lambda m: m.update(shards="abc"), "manifest.shards is 'abc', expected list[Shard]"),
    "a string count": (
        lambda m: m["shards"][0].update(tokens="12"),
        "shards[0].tokens is '12', expected int",
    ),
    "a list tokenizer": (lambda m: m.update(tokenizer=[]), "manifest.tokenizer is [], expected dict"),
    "a string flag": (lambda m: m.update(complete="yes"), "manifest.complete is 'yes', expected bool"),
    "a bool count": (lambda m: m["shards"][1].update(rows=True), "shards[1].rows is True, expected int"),
    "a string in skipped": (
        lambda m: m["shards"][0].update(skipped={"empty": "x"}),
        "expected dict[str, int]",
    ),
    "a shard outside the folder": (
        lambda m: m["shards"][0].update(prefix="../../etc/passwd"),
        "prefix '../../etc/passwd' is not a file name in the folder",
    ),
    "a shard that is not an object": (lambda m: m["shards"].append(3), "shards[2] is not an object"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_manifest_is_one_line_wherever_it_is_read(folder, case, tmp_path):
    import json

    from typer.testing import CliRunner

    from zebra.cli.main import app
    from zebra.data.prefixes import resolve_prefixes

    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit, message = MALFORMED[case]
    edit(manifest)
    path.write_text(json.dumps(manifest))
    runner = CliRunner()
    for args in (["data", "inspect", str(folder)], ["train", "tiny", "--data", str(folder), "--dry-run"]):
        r = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert r.exit_code == 1 and "Traceback" not in r.output and "bug" not in r.output, r.output
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "not a valid zebra data manifest" in errors[0], r.stderr
        assert message in errors[0]
    with pytest.raises(ZebraError, match="not a valid zebra data manifest"):
        resolve_prefixes(str(folder))


def test_a_folder_with_an_empty_shard_is_reported(tmp_path, texts):
    """Shards whose documents were all skipped (empty texts here): they read 0 documents instead of failing to
    memory-map their 0-byte .bin; the sample comes from the shard that has one."""
    source = write_source("jsonl", tmp_path / "src", [*texts[:1], "", ""])
    run_prep(plan_prep(open_source(str(source)), tmp_path / "out", tokenizer="byte", shards=3, workers=1))
    r = inspect_data(str(tmp_path / "out"), checksums=True)
    assert r["documents"] == 1 and sorted(s["documents"] for s in r["shards"])[-1] == 1
    assert any(s["documents"] == 0 for s in r["shards"])
    assert r["samples"][0]["tokens"] == len(expected_ids("byte", texts[:1])[0])
