"""The bundled corpus (`@sample`): reproducible from its generator, tokenized once into the cache, learnable."""

from __future__ import annotations

import gzip
import json

import numpy as np

from zebra.data.bundled_corpus import CORPUS_PATH, NUM_DOCUMENTS, generate_documents
from zebra.data.indexed import check_prefix
from zebra.data.inspection import inspect_data
from zebra.data.manifest import read_manifest, write_manifest
from zebra.data.prefixes import bundled_prefix, bundled_sample, resolve_prefixes


def shipped_texts() -> list[str]:
    return [json.loads(line)["text"] for line in gzip.decompress(CORPUS_PATH.read_bytes()).splitlines()]


def test_generator_reproduces_the_shipped_corpus():
    assert shipped_texts() == list(generate_documents())
    assert len(shipped_texts()) == NUM_DOCUMENTS and CORPUS_PATH.stat().st_size < 2_000_000


def test_bundled_prefix_tokenizes_once_into_the_cache(zebra_cache, bpe_dir):
    prefix = bundled_prefix("byte")
    assert prefix.is_relative_to(zebra_cache)
    bin_path = prefix.parent / f"{prefix.name}.bin"
    stamp = bin_path.stat().st_mtime_ns
    assert bundled_prefix("byte") == prefix and bin_path.stat().st_mtime_ns == stamp
    m = read_manifest(prefix.parent)
    texts = shipped_texts()
    assert m.complete and m.documents == len(texts)
    assert m.tokens == sum(len(t.encode()) + 1 for t in texts)  # bytes + EOD
    assert resolve_prefixes("@sample") == [(str(prefix), 1.0)]
    report = inspect_data("@sample")
    assert report["tokenizer_check"]["status"] == "ok" and report["documents"] == len(texts)
    other = bundled_prefix(str(bpe_dir))
    assert other.parent != prefix.parent and read_manifest(other.parent).documents == len(texts)


def test_without_prepare_the_sample_is_planned_and_nothing_written(tokenizer_name, tmp_path, monkeypatch):
    """A dry run's answer for an empty cache: the prefix tokenizing will make and its document count, with no
    folder, shard, manifest or lock written; the cache's own answer once it is tokenized (then read, not guessed)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZEBRA_CACHE", str(cache))
    planned = bundled_sample(tokenizer_name, prepare=False)
    assert resolve_prefixes("@sample:2", tokenizer=tokenizer_name, prepare=False) == [
        (str(planned.prefix), 2.0)
    ]
    assert not planned.prepared and not cache.exists()
    made = bundled_sample(tokenizer_name)
    assert made == planned._replace(prepared=True)
    assert (
        check_prefix(made.prefix).documents
        == read_manifest(made.prefix.parent).documents
        == planned.documents
    )
    assert bundled_sample(tokenizer_name, prepare=False) == made
    manifest = read_manifest(made.prefix.parent)  # half-written (a prep killed midway): still only planned
    manifest.complete = False
    write_manifest(made.prefix.parent, manifest)
    assert bundled_sample(tokenizer_name, prepare=False) == planned
    assert bundled_sample(tokenizer_name) == made  # and redone by the next real use


def test_corpus_is_learnable_bigram_entropy_far_below_uniform():
    """A byte bigram model fit on 90% predicts the other 10% at < 2.6 nats/byte (uniform: ln 259 = 5.56)."""
    docs = [t.encode() for t in shipped_texts()]
    cut = len(docs) * 9 // 10
    train = np.frombuffer(b"".join(docs[:cut]), np.uint8).astype(np.int64)
    held = np.frombuffer(b"".join(docs[cut:]), np.uint8).astype(np.int64)
    counts = np.ones((256, 256))
    np.add.at(counts, (train[:-1], train[1:]), 1)
    probs = counts / counts.sum(1, keepdims=True)
    assert -np.log(probs[held[:-1], held[1:]]).mean() < 2.6
