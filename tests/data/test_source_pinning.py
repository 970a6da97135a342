"""A resumed prep reads the rows it started on: a hub dataset at the commit the first run recorded, local files
only while their size and first and last MiB are unchanged (else a one-line refusal)."""

from __future__ import annotations

import pytest

from zebra.core.errors import ZebraError
from zebra.data.folder import ShardFolder
from zebra.data.manifest import read_manifest
from zebra.data.prep import plan_prep, run_prep
from zebra.data.text_sources import fineweb_sample_source, open_source

from .helpers import expected_ids, read_all, write_source


class Stop(Exception):
    pass


def _interrupted_prep(source, out, **kw) -> None:
    """Run a prep and stop it right after its first shard is committed (as a kill would), whatever the timing."""
    commit = ShardFolder.commit

    def commit_then_stop(self, *, complete, **stats):
        commit(self, complete=complete, **stats)
        raise Stop

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Stop):
        patch.setattr(ShardFolder, "commit", commit_then_stop)
        run_prep(plan_prep(source, out, tokenizer="byte", workers=1, **kw))
    assert len(read_manifest(out).shards) == 1 and not read_manifest(out).complete


def _first_letter_replaced(jsonl: str) -> str:
    """The first document's first letter changed, the file's size kept."""
    i = jsonl.index('"text": "') + len('"text": "')
    return jsonl[:i] + ("Z" if jsonl[i] != "Z" else "Y") + jsonl[i + 1 :]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda text: text + '{"text": "one more document"}\n', "bytes, now"),
        (_first_letter_replaced, "the same size, other content in its first or last MiB"),
    ],
    ids=["grown", "same size"],
)
def test_a_changed_local_file_stops_the_resume(texts, tmp_path, edit, message):
    source = write_source("jsonl", tmp_path / "src", texts)
    _interrupted_prep(open_source(str(source)), tmp_path / "out", shards=4)
    source.write_text(edit(source.read_text()))
    with pytest.raises(ZebraError, match=message) as e:
        plan_prep(open_source(str(source)), tmp_path / "out", tokenizer="byte")
    assert f"{source.resolve()} changed since this folder was started" in e.value.message
    assert "--force" in e.value.fix


def test_an_unchanged_local_source_resumes_and_records_its_files(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    _interrupted_prep(open_source(str(source)), tmp_path / "out", shards=4)
    run_prep(plan_prep(open_source(str(source)), tmp_path / "out", tokenizer="byte"))
    assert read_all(tmp_path / "out") == expected_ids("byte", texts)
    (fingerprint,) = read_manifest(tmp_path / "out").source["fingerprints"]
    assert fingerprint["bytes"] == source.stat().st_size


def test_a_hub_resume_reads_the_commit_it_started_on(fake_hub, tmp_path):
    _interrupted_prep(fineweb_sample_source("10BT"), tmp_path / "out", max_docs=300, shards=3)
    assert read_manifest(tmp_path / "out").source["revision"] == "rev-1"
    fake_hub.revision = "rev-2"  # the dataset moved on since
    run_prep(plan_prep(fineweb_sample_source("10BT"), tmp_path / "out", tokenizer="byte", max_docs=300))
    manifest = read_manifest(tmp_path / "out")
    assert manifest.complete and manifest.source["revision"] == "rev-1"
    assert set(fake_hub.loads) == {"rev-1"}  # every read, before and after the resume, asked for that commit
    texts = [row["text"] for row in fake_hub.rows]
    assert read_all(tmp_path / "out") == expected_ids("byte", texts)

    run_prep(
        plan_prep(fineweb_sample_source("10BT"), tmp_path / "out", tokenizer="byte", max_docs=300, force=True)
    )
    assert read_manifest(tmp_path / "out").source["revision"] == "rev-2" and fake_hub.loads[-1] == "rev-2"
