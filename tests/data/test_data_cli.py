"""`zebra data prep / convert-fla / inspect` and `zebra bench data` through the real CLI (no TTY, offline)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app

from .helpers import expected_ids, read_all, write_source


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args, env=None):
        return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200", **(env or {})})

    return invoke


def one_line_error(result, text: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and text in errors[0], result.stderr


def test_prep_then_inspect(cli, texts, tmp_path):
    source = write_source("parquet", tmp_path / "src", texts)
    out = tmp_path / "my data"
    r = cli("data", "prep", "--source", source, "-t", "byte", "-o", out, "--shards", "2", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["complete"] and report["totals"]["documents"] == len(texts) and len(report["shards"]) == 2
    assert read_all(out) == expected_ids("byte", texts)

    r = cli("data", "inspect", out, "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["documents"] == len(texts) and info["tokenizer_check"]["status"] == "ok"
    r = cli("data", "inspect", out)
    assert r.exit_code == 0 and "document lengths" in r.stdout and "byte: ok" in r.stdout

    again = cli("data", "prep", "--source", source, "-t", "byte", "-o", out)
    assert again.exit_code == 0 and "already complete" in again.stdout


def test_prep_into_a_folder_another_prep_writes_is_refused(cli, texts, tmp_path, hold_folder):
    source = write_source("jsonl", tmp_path / "src", texts)
    assert cli("data", "prep", "--source", source, "-t", "byte", "-o", tmp_path / "out").exit_code == 0
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    pid = hold_folder(tmp_path / "out")
    r = cli("data", "prep", "--source", source, "-t", "byte", "-o", tmp_path / "out", "--force")
    one_line_error(r, f"in use by pid {pid} on")
    assert "another --output" in r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before  # --force removed nothing


def test_resuming_a_folder_another_prep_writes_fails_before_saying_resuming(
    cli, texts, tmp_path, hold_folder
):
    from zebra.data.manifest import read_manifest, write_manifest

    source = write_source("jsonl", tmp_path / "src", texts)
    out = tmp_path / "out"
    prep = ("data", "prep", "--source", source, "-t", "byte", "-o", out, "--shards", "2")
    assert cli(*prep).exit_code == 0

    def as_a_killed_prep_leaves_it():  # one of the two shards committed
        m = read_manifest(out)
        m.shards, m.complete = m.shards[:1], False
        write_manifest(out, m)

    as_a_killed_prep_leaves_it()
    r = cli(*prep)
    assert r.exit_code == 0 and f"resuming {out}: 1 shard(s) already done" in r.stdout, r.output
    as_a_killed_prep_leaves_it()
    pid = hold_folder(out)
    r = cli(*prep)
    one_line_error(r, f"in use by pid {pid} on")
    assert "already done" not in r.output  # no resume line before the lock error


def test_a_hub_prep_into_a_folder_another_prep_writes_fails_before_asking(
    cli, fake_hub, tmp_path, hold_folder, monkeypatch
):
    """A hub prep asked 'Download and tokenize ...?' and only then found the folder locked by another prep: the
    lock's error now comes first, before the question, the tokenizer and the hub."""
    from zebra.cli import data as data_cli

    asked = []
    monkeypatch.setattr(data_cli, "confirm", lambda message, **kw: asked.append(message) or True)
    prep = ("data", "prep", "--source", "someone/corpus", "-t", "byte", "--max-docs", "20", "-o")
    pid = hold_folder(tmp_path / "busy")
    r = cli(*prep, tmp_path / "busy")
    one_line_error(r, f"busy: in use by pid {pid} on")
    assert asked == [] and fake_hub.loads == [], (asked, fake_hub.loads)
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == [".lock"]  # the holder's, nothing more

    r = cli(*prep, tmp_path / "free")  # a folder nobody writes: asked once, then written
    assert r.exit_code == 0, r.output
    assert asked == ["Download and tokenize someone/corpus?"]
    assert len(read_all(tmp_path / "free")) == 20


def test_prep_says_when_it_makes_fewer_shards_than_asked(cli, texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts[:3])
    r = cli("data", "prep", "--source", source, "-t", "byte", "-o", tmp_path / "out", "--shards", "8")
    assert r.exit_code == 0, r.output
    assert "warning: --shards 8: 3 shard(s), one per document (only 3 documents)" in r.stderr
    assert len(read_all(tmp_path / "out")) == 3


def test_prep_default_output_folder(cli, texts, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = write_source("jsonl", tmp_path / "src", texts[:5])
    r = cli("data", "prep", "--source", source, "-t", "byte")
    assert r.exit_code == 0, r.output
    assert len(read_all(tmp_path / "data" / "docs")) == 5


def test_inspect_tokenizer_mismatch_fails(cli, texts, bpe_dir, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts[:5])
    assert cli("data", "prep", "--source", source, "-t", "byte", "-o", tmp_path / "out").exit_code == 0
    one_line_error(
        cli("data", "inspect", tmp_path / "out", "-t", bpe_dir), "vocabulary differs from the manifest"
    )


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_prep_that_writes_no_document_is_an_error(cli, tmp_path, json_flag):
    """Every row skipped (here: a file of binary bytes, not UTF-8) leaves nothing to train on: exit 1, no '✓'."""
    (tmp_path / "binary.txt").write_bytes(bytes(range(128, 256)) * 4)
    r = cli(
        "data", "prep", "--source", tmp_path / "binary.txt", "-t", "byte", "-o", tmp_path / "out", *json_flag
    )
    one_line_error(r, "out: no document was written (1 row(s) read, all skipped)")
    assert "✓" not in r.stdout
    assert '"non_utf8": 1' in r.stdout if json_flag else "1 non utf8" in r.stderr  # why, in each form
    again = cli("data", "prep", "--source", tmp_path / "binary.txt", "-t", "byte", "-o", tmp_path / "out")
    one_line_error(again, "out: no document was written")  # the complete folder: not "nothing to do" first
    assert "✓" not in again.stdout and "already complete" not in again.stdout


def test_prep_without_a_source_and_no_tty(cli):
    one_line_error(cli("data", "prep", "-t", "byte"), "missing --sample or --source")
    one_line_error(cli("data", "prep", "--sample", "10BT", "--source", "x.jsonl"), "exclusive")


@pytest.mark.parametrize(
    ("args", "what", "local"),
    [
        (["--sample", "10BT"], "HuggingFaceFW/fineweb-edu sample-10BT", ""),
        (["--source", "HuggingFaceFW/fineweb-edu", "--config", "x"], "HuggingFaceFW/fineweb-edu x", ""),
        # a mistyped local path looks like a dataset id: the error says there is no such path either
        (["--source", "someone/corpus"], "someone/corpus", "; no local file or folder someone/corpus either"),
    ],
)
def test_hub_offline_says_use_source(cli, args, what, local, tmp_path):
    r = cli("data", "prep", *args, "-t", "byte", "-o", tmp_path / "out", "--yes", env={"HF_HUB_OFFLINE": "1"})
    one_line_error(r, f"cannot reach the Hugging Face Hub for {what} (HF_HUB_OFFLINE is set{local})")
    assert "--source PATH" in r.stderr


def test_hub_error_from_datasets_itself_is_one_line(cli, monkeypatch, tmp_path):
    """Past our quick reachability check, the `datasets` library's own offline failure is mapped too."""
    from zebra.data import text_sources

    monkeypatch.setattr(text_sources, "_hub_reachable", lambda: True)
    monkeypatch.setattr(text_sources, "_hub_revision", lambda src: "rev-1")
    r = cli("data", "prep", "--sample", "10BT", "-t", "byte", "-o", tmp_path / "out", "--yes")
    one_line_error(r, "cannot reach the Hugging Face Hub for HuggingFaceFW/fineweb-edu")


def test_an_unreachable_hub_is_asked_once_and_fails_at_once(cli, monkeypatch, tmp_path):
    """Offline without HF_HUB_OFFLINE: one connection attempt, then the one-line error. The hub libraries,
    which would retry for half a minute, are never called."""
    import socket

    import datasets
    import huggingface_hub

    from zebra.data import text_sources

    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    probes, hub_calls = [], []
    connect = socket.create_connection
    monkeypatch.setattr(
        socket, "create_connection", lambda addr, timeout=None: probes.append(addr) or connect(addr, timeout)
    )
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: hub_calls.append(a) or 1 / 0)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda *a, **k: hub_calls.append(a) or 1 / 0)
    text_sources._connects.cache_clear()
    env = {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}  # the discard port: nothing listens
    r = cli("data", "prep", "--sample", "10BT", "-t", "byte", "-o", tmp_path / "out", "--yes", env=env)
    one_line_error(
        r, "cannot reach the Hugging Face Hub for HuggingFaceFW/fineweb-edu sample-10BT (no network)"
    )
    assert probes == [("127.0.0.1", 9)] and hub_calls == []


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e400"])
def test_max_tokens_must_be_a_finite_number(cli, texts, tmp_path, value):
    source = write_source("jsonl", tmp_path / "src", texts[:5])
    r = cli("data", "prep", "--source", source, "-t", "byte", "-o", tmp_path / "out", "--max-tokens", value)
    one_line_error(r, "--max-tokens")
    assert "not a finite number" in r.stderr and "bug" not in r.output
    assert not (tmp_path / "out").exists()


def test_max_tokens_accepts_a_float_count(cli, texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    r = cli(
        "data",
        "prep",
        "--source",
        source,
        "-t",
        "byte",
        "-o",
        tmp_path / "out",
        "--max-tokens",
        "2e3",
        "--json",
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["config"]["max_tokens"] == 2000 and 2000 <= report["totals"]["tokens"] < 2000 + 3000


def test_prep_into_another_tokenizers_folder(cli, texts, bpe_dir, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts[:5])
    assert cli("data", "prep", "--source", source, "-t", "byte", "-o", tmp_path / "out").exit_code == 0
    r = cli("data", "prep", "--source", source, "-t", bpe_dir, "-o", tmp_path / "out")
    one_line_error(r, "holds data tokenized with byte")


def test_prep_dtype_too_small(cli, texts, tmp_path):
    """A tokenizer whose vocabulary exceeds the requested dtype (a 70,000-word WordLevel tokenizer, uint16)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(70_000)} | {"<eos>": 70_000, "<unk>": 70_001}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>").save_pretrained(
        tmp_path / "big"
    )
    source = write_source("jsonl", tmp_path / "src", ["w1 w69999", "w5"])
    r = cli(
        "data",
        "prep",
        "--source",
        source,
        "-t",
        tmp_path / "big",
        "-o",
        tmp_path / "out",
        "--dtype",
        "uint16",
    )
    one_line_error(r, "70002 ids exceeds --dtype uint16")
    r = cli("data", "prep", "--source", source, "-t", tmp_path / "big", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["dtype"] == "int32"
    assert read_all(tmp_path / "out") == [[1, 69_999, 70_000], [5, 70_000]]


def test_convert_fla_cli(cli, tmp_path):
    import datasets

    chunks = [[i, i + 1, i + 2, i + 3] for i in range(0, 400, 4)]
    datasets.Dataset.from_dict({"input_ids": chunks}).save_to_disk(str(tmp_path / "fla"))
    r = cli("data", "convert-fla", tmp_path / "fla", "--output", tmp_path / "out", "--split", "test")
    one_line_error(r, "--split test: ")  # a plain Dataset has no splits: not silently the whole of it
    assert "leave --split out" in r.stderr
    r = cli("data", "convert-fla", tmp_path / "fla", "--output", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "verified 400 tokens" in r.stdout and read_all(tmp_path / "out") == chunks


def test_bench_data_json(cli):
    r = cli("bench", "data", "--repeat", "1", "--rounds", "1", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["identical_output"] is True
    assert report["documents"] == 3000 and report["tokens"] > report["corpus_bytes"] * 0.9
    assert report["speedup"] == pytest.approx(report["baseline_seconds"] / report["ours_seconds"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file or directory"),
        ('{"txt": "a"}\n', "line 1 has no string 'text' field"),
        ('{"text": "a"}\nnot json\n', "line 2 is not JSON"),
    ],
)
def test_bench_data_bad_corpus_is_one_line(cli, tmp_path, content, message):
    corpus = tmp_path / "corpus.jsonl"
    if content is not None:
        corpus.write_text(content)
    r = cli("bench", "data", "--corpus", corpus, "--rounds", "1")
    one_line_error(r, f"--corpus {corpus}: {message}")
    assert 'one {"text": "..."} object per line' in r.stderr


def test_terminal_asks_which_sample(tmp_path):
    """On a TTY with neither --sample nor --source, prep asks (questionary); the choice goes to the hub."""
    import os
    import sys

    import pexpect

    code = "import sys; sys.argv[0] = 'zebra'; from zebra.cli.main import main; main()"
    env = os.environ | {"HF_HUB_OFFLINE": "1", "COLUMNS": "200", "TERM": "xterm"}
    env.pop("ZEBRA_YES", None)
    child = pexpect.spawn(
        sys.executable,
        ["-c", code, "data", "prep", "-t", "byte", "-o", str(tmp_path / "o")],
        env=env,
        timeout=120,
    )
    child.expect("Which FineWeb-Edu sample")
    child.send("\x1b[B")  # arrow down: 100BT
    child.send("\r")
    child.expect("cannot reach the Hugging Face Hub for HuggingFaceFW/fineweb-edu sample-100BT")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1


def test_train_takes_the_preps_tokenizer_under_another_path_and_refuses_another(
    cli, texts, bpe_dir, tmp_path
):
    """`zebra train --data` compares the data's tokenizer with `data.tokenizer` by vocabulary, not by the path it
    was named by: a copied tokenizer folder is the same tokenizer; a different one is refused in one line."""
    import shutil

    from zebra.data.tokenizers import train_bpe

    source = write_source("jsonl", tmp_path / "src", texts)
    prep = cli("data", "prep", "--source", source, "-t", bpe_dir, "-o", tmp_path / "prep", "--yes")
    assert prep.exit_code == 0, prep.output
    moved = tmp_path / "moved-bpe"
    shutil.copytree(bpe_dir, moved)
    train = (
        "train",
        "tiny",
        "--data",
        tmp_path / "prep",
        "--dry-run",
        "--set",
        "model.vocab_size=600",
        "-o",
        tmp_path / "runs",
    )  # not the repository's runs/tiny (the README's run): another model
    same = cli(*train, "--set", f"data.tokenizer={moved}")
    assert same.exit_code == 0, same.output
    other = tmp_path / "other-bpe"
    train_bpe(texts[:40], 400).save_pretrained(other)
    one_line_error(
        cli(*train, "--set", f"data.tokenizer={other}"), f"tokenized with {bpe_dir}, but the recipe"
    )
