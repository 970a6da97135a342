"""`zebra data prep` (library): what it writes, megatron-core reads back token for token; sharding, limits, resume."""

from __future__ import annotations

import json

import pytest

from zebra.core.errors import ZebraError
from zebra.data.indexed import sha256_file
from zebra.data.manifest import read_manifest
from zebra.data.prefixes import resolve_prefixes
from zebra.data.prep import plan_prep, run_prep
from zebra.data.text_sources import open_source

from .helpers import expected_ids, read_all, write_jsonl, write_source


def prep(source, out, tokenizer="byte", **kw):
    plan = plan_prep(
        open_source(str(source), text_field=kw.pop("text_field", "text")), out, tokenizer=tokenizer, **kw
    )
    return plan, run_prep(plan)


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "arrow", "txt"])
def test_round_trip(kind, tokenizer_name, texts, tmp_path):
    source = write_source(kind, tmp_path / "src", texts)
    _, result = prep(source, tmp_path / "out", tokenizer_name, workers=2, shards=3)
    assert read_all(tmp_path / "out") == expected_ids(tokenizer_name, texts)
    m = read_manifest(tmp_path / "out")
    assert m.complete and len(m.shards) == 3 and result.shards_written == 3
    assert m.documents == len(texts) and m.tokens == sum(map(len, expected_ids(tokenizer_name, texts)))
    assert [s.first_row for s in m.shards] == [0, m.config["rows_per_shard"], 2 * m.config["rows_per_shard"]]
    assert m.dtype == "uint16" and m.tokenizer["eod_id"] is not None
    for s in m.shards:
        for ext in ("bin", "idx"):
            assert sha256_file(tmp_path / "out" / f"{s.prefix}.{ext}") == getattr(s, f"{ext}_sha256")


def test_inline_and_parallel_workers_write_identical_files(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    prep(source, tmp_path / "one", workers=1, shards=2)
    prep(source, tmp_path / "two", workers=2, shards=2)
    one, two = read_manifest(tmp_path / "one"), read_manifest(tmp_path / "two")
    assert [s.bin_sha256 for s in one.shards] == [s.bin_sha256 for s in two.shards]


def test_max_docs_and_max_tokens(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    prep(source, tmp_path / "docs", max_docs=25, workers=2)
    assert read_all(tmp_path / "docs") == expected_ids("byte", texts[:25])
    want = expected_ids("byte", texts)
    budget = sum(map(len, want[:10])) - 5  # reached inside document 10
    _, result = prep(source, tmp_path / "tokens", max_tokens=budget, workers=2, shards=4)
    assert read_all(tmp_path / "tokens") == want[:10]
    assert result.manifest.complete and result.manifest.rows == 10


@pytest.mark.parametrize(
    ("documents", "shards", "made", "note"),
    [
        (3, 8, 3, "--shards 8: 3 shard(s), one per document (only 3 documents)"),
        (11, 8, 6, "--shards 8: 6 shards of 2 documents, the last 1 (every shard but the last holds "
         "ceil(11 / 8) = 2 documents, so 11 documents fill 6)"),
        (12, 5, 4, "--shards 5: 4 shards of 3 documents (every shard but the last holds ceil(12 / 5) = 3 "
         "documents, so 12 documents fill 4)"),
        (12, 4, 4, None),
    ],
)  # fmt: skip
def test_fewer_shards_than_asked_is_noted(texts, tmp_path, documents, shards, made, note):
    source = write_source("jsonl", tmp_path / "src", texts[:documents])
    _, result = prep(source, tmp_path / "out", shards=shards)
    assert len(result.manifest.shards) == made and read_all(tmp_path / "out") == expected_ids(
        "byte", texts[:documents]
    )
    assert [n for n in result.notes if n.startswith("--shards")] == ([note] if note else [])


def test_progress_reports_reach_the_total(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    calls = []

    def record(done, total, **counts):
        calls.append((done, total, counts))

    result = run_prep(plan_prep(open_source(str(source)), tmp_path / "rows", tokenizer="byte"), record)
    done, total, counts = calls[-1]
    assert done == total == len(texts)  # rows of a source that says how many it has
    assert (counts["docs"], counts["tok"]) == (result.manifest.documents, result.manifest.tokens)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    budget = result.manifest.tokens // 3
    calls.clear()
    plan = plan_prep(open_source(str(source)), tmp_path / "tokens", tokenizer="byte", max_tokens=budget)
    result = run_prep(plan, record)
    assert calls[-1][:2] == (result.manifest.tokens, budget)  # a token budget counts tokens
    assert result.manifest.tokens >= budget


def test_rerun_of_a_complete_folder_changes_nothing(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    prep(source, tmp_path / "out", shards=2)
    before = (tmp_path / "out" / "manifest.json").read_text()
    plan, result = prep(source, tmp_path / "out")  # --shards may be left out: the folder's sharding is kept
    assert plan.resumed and result.shards_written == 0 and result.shards_kept == 2
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == json.loads(before)


def test_resume_regenerates_from_a_truncated_shard(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    prep(source, tmp_path / "out", shards=4)
    m = read_manifest(tmp_path / "out")
    victim = tmp_path / "out" / f"{m.shards[2].prefix}.bin"
    victim.write_bytes(victim.read_bytes()[:-7])  # a truncated .bin
    plan = plan_prep(open_source(str(source), text_field="text"), tmp_path / "out", tokenizer="byte")
    resumed: list[tuple[int, int]] = []
    result = run_prep(plan, on_resume=lambda kept, tokens: resumed.append((kept, tokens)))
    assert result.shards_kept == 2 and result.shards_written == 2
    assert resumed == [
        (2, m.shards[0].tokens + m.shards[1].tokens)
    ]  # what was kept once checked: the rate's base
    assert any("truncated" in n and m.shards[2].prefix in n for n in plan.notes)
    assert read_all(tmp_path / "out") == expected_ids("byte", texts)


def test_other_tokenizer_in_output_folder_is_one_line_error(texts, bpe_dir, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    prep(source, tmp_path / "out")
    with pytest.raises(ZebraError, match=r"holds data tokenized with byte .*not .*bpe") as e:
        prep(source, tmp_path / "out", str(bpe_dir))
    assert "--force" in e.value.fix
    with pytest.raises(ZebraError, match=r"other settings \(config: max_docs was None, now 5\)"):
        prep(source, tmp_path / "out", max_docs=5)
    other = write_source("jsonl", tmp_path / "other", [t + " more" for t in texts])
    with pytest.raises(ZebraError, match=r"other settings \(source: ") as e:
        prep(other, tmp_path / "out")
    shown = e.value.message.split("(source: ", 1)[1]  # each old and new value cut to 60 characters
    assert "..." in shown and all(len(part) < 80 for part in shown.replace(", now ", " was ").split(" was "))
    prep(source, tmp_path / "out", str(bpe_dir), force=True)
    assert read_all(tmp_path / "out") == expected_ids(str(bpe_dir), texts)
    assert read_manifest(tmp_path / "out").tokenizer["name"] == str(bpe_dir)


def test_skipped_rows_are_counted_and_reported(tmp_path):
    good = ["first document", "second document", "third"]
    rows = [
        {"text": good[0]},
        {"text": ""},
        {"text": "   \n\t "},
        {"title": "no text field here"},
        {"text": None},
        {"text": good[1]},
        {"text": 42},
    ]
    path = write_jsonl(tmp_path / "docs.jsonl", rows)
    with open(path, "ab") as f:
        f.write(b'{"text": "bad \xff\xfe bytes"}\n')  # not UTF-8
        f.write(b'{"text": "\\ud800 lone surrogate"}\n')  # valid JSON, not encodable as UTF-8
        f.write(b"{not json\n")
        f.write(b"\n")  # a blank line is an empty row
        f.write(b'{"text": "third"}')  # no trailing newline
    _, result = prep(path, tmp_path / "out", workers=2)
    m = result.manifest
    assert read_all(tmp_path / "out") == expected_ids("byte", good)
    assert m.rows == 12 and m.documents == 3
    assert m.skipped() == {"empty": 4, "missing_field": 1, "non_utf8": 2, "malformed": 2}


def test_resolve_prefixes_forms(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    _, result = prep(source, tmp_path / "out", shards=3)
    prefixes = resolve_prefixes(str(tmp_path / "out"))
    assert [p for p, _ in prefixes] == [
        str((tmp_path / "out" / s.prefix).resolve()) for s in result.manifest.shards
    ]
    assert sum(w for _, w in prefixes) == pytest.approx(1.0)
    assert [w for _, w in prefixes] == pytest.approx(
        [s.tokens / result.manifest.tokens for s in result.manifest.shards]
    )
    weighted = resolve_prefixes(f"{tmp_path / 'out' / 'manifest.json'}:0.25")
    assert sum(w for _, w in weighted) == pytest.approx(0.25)
    plain = prefixes[1][0]
    assert resolve_prefixes(f"{plain}:3") == [(plain, 3.0)]
    with pytest.raises(ZebraError, match=r"nothing: no data there"):
        resolve_prefixes(str(tmp_path / "nothing"))


def test_resolve_prefixes_refuses_unfinished_and_truncated_data(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    _, result = prep(source, tmp_path / "out", shards=2)
    manifest = (tmp_path / "out" / "manifest.json").read_text()
    (tmp_path / "out" / "manifest.json").write_text(manifest.replace('"complete": true', '"complete": false'))
    with pytest.raises(ZebraError, match="did not finish"):
        resolve_prefixes(str(tmp_path / "out"))
    (tmp_path / "out" / "manifest.json").write_text(manifest)
    idx = tmp_path / "out" / f"{result.manifest.shards[1].prefix}.idx"
    idx.write_bytes(idx.read_bytes()[:40])
    with pytest.raises(ZebraError, match="truncated"):
        resolve_prefixes(str(tmp_path / "out"))


@pytest.mark.parametrize("kind", ["jsonl", "txt"])
def test_text_given_as_training_data_names_the_prep_that_tokenizes_it(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = write_source(kind, tmp_path / "corpus", ["one document", "another"])
    with pytest.raises(ZebraError, match="not tokenized data") as error:
        resolve_prefixes(str(source), tokenizer="byte")
    name = "docs" if kind == "jsonl" else "corpus"
    assert f"zebra data prep --source {source} --tokenizer byte --output data/{name}" in error.value.fix
    prep(source, f"data/{name}")  # the command the fix names, then the --data it names reads
    assert len(resolve_prefixes(f"data/{name}")) == 1
    (tmp_path / "empty").mkdir()  # an empty folder holds no text: the plain message
    with pytest.raises(ZebraError, match="no data there"):
        resolve_prefixes(str(tmp_path / "empty"))


def test_missing_text_field_is_one_line_error(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"body": "x"}])
    with pytest.raises(ZebraError, match=r"--text-field text: not in docs.jsonl \(fields: body\)"):
        open_source(str(path))
    parquet = write_source("parquet", tmp_path / "pq", ["a", "b"])
    with pytest.raises(ZebraError, match=r"--text-field content: not in a.parquet \(fields: id, text\)"):
        open_source(str(parquet), text_field="content")


def test_batches_of_a_mixed_folder_start_at_any_row(tmp_path):
    """Rows of jsonl files and runs of .txt files (one row each, read several files a batch) in path order:
    whatever row a resumed prep starts at, it gets exactly the rows from there on, each batch saying its first."""
    from zebra.data.text_sources import decode_texts

    write_jsonl(tmp_path / "a.jsonl", [{"text": f"a{i}"} for i in range(3)])
    (tmp_path / "b").mkdir()
    for i in range(5):
        (tmp_path / "b" / f"{i}.txt").write_text(f"b{i}")
    write_jsonl(tmp_path / "c.jsonl", [{"text": f"c{i}"} for i in range(2)])
    rows = [f"a{i}" for i in range(3)] + [f"b{i}" for i in range(5)] + ["c0", "c1"]
    source = open_source(str(tmp_path))
    assert source.count_rows() == len(rows)
    for start in range(len(rows) + 1):
        got, expected_start = [], start
        for batch in source.batches(start, batch_rows=2):
            assert batch.start == expected_start and 1 <= len(batch) <= 2
            got += decode_texts(batch)[0]
            expected_start += len(batch)
        assert got == rows[start:], start


def test_a_text_file_too_large_for_one_document_is_refused(tmp_path, monkeypatch):
    import zebra.data.text_sources as text_sources

    monkeypatch.setattr(text_sources, "MAX_TEXT_FILE_BYTES", 100)
    (tmp_path / "small.txt").write_text("a" * 100)
    assert open_source(str(tmp_path / "small.txt")).count_rows() == 1
    (tmp_path / "dump.txt").write_text("a line of a corpus dump\n" * 5)
    with pytest.raises(ZebraError, match=r"dump\.txt: a \.txt file is one document") as error:
        open_source(str(tmp_path))
    assert ".jsonl" in error.value.fix


def test_unknown_source_and_bad_numbers(tmp_path):
    with pytest.raises(ZebraError, match="no such file or folder"):
        open_source(str(tmp_path / "missing.jsonl"))
    source = write_source("jsonl", tmp_path / "src", ["a"])
    with pytest.raises(ZebraError, match="--max-docs 0: must be at least 1"):
        prep(source, tmp_path / "out", max_docs=0)


def test_resolve_prefixes_leaves_out_empty_shards(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": "a"}, {"text": "b"}, {"text": ""}, {"text": " "}])
    _, result = prep(path, tmp_path / "out", shards=2)
    assert [s.documents for s in result.manifest.shards] == [2, 0]
    assert resolve_prefixes(str(tmp_path / "out")) == [
        (str((tmp_path / "out" / result.manifest.shards[0].prefix).resolve()), 1.0)
    ]


def test_tokenizer_class_that_changes_text_before_its_backend(texts, bpe_dir, tmp_path):
    """The batched fast path is confirmed per worker; a class whose __call__ differs gets its own output."""
    from transformers import PreTrainedTokenizerFast

    class Lowercasing(PreTrainedTokenizerFast):
        def _encode_plus(self, text, *args, **kwargs):
            text = [t.lower() for t in text] if isinstance(text, list) else text.lower()
            return super()._encode_plus(text, *args, **kwargs)

    tok = Lowercasing(tokenizer_file=str(bpe_dir / "tokenizer.json"), eos_token="<|endoftext|>")
    source = write_source("jsonl", tmp_path / "src", texts)
    plan = plan_prep(open_source(str(source)), tmp_path / "out", tokenizer=str(bpe_dir), workers=2)
    plan.tokenizer = tok
    run_prep(plan)
    want = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
    assert want != expected_ids(str(bpe_dir), texts)
    assert read_all(tmp_path / "out") == want
