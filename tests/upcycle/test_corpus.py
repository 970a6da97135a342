"""The real-text corpus tokenized for the teacher: Python documentation through `zebra data prep` with SmolLM2's
tokenizer, ready for distillation tests and figures."""

from __future__ import annotations

import json


def test_python_docs_tokenize_with_the_teachers_tokenizer(python_docs, python_docs_tokens, smollm2_teacher):
    from zebra.data.indexed import open_dataset
    from zebra.data.manifest import read_manifest, shard_paths

    manifest = read_manifest(python_docs_tokens)
    train = [json.loads(line) for line in (python_docs / "train.jsonl").read_text().splitlines()]
    assert manifest.complete and manifest.documents == len(train)
    assert manifest.tokenizer["vocab_size"] == smollm2_teacher.shape.vocab_size
    dataset = open_dataset(shard_paths(python_docs_tokens, manifest)[0])  # memory-mapped: keep it open
    first = dataset[0].tolist()  # the first document, EOD appended
    tok = smollm2_teacher.tokenizer
    assert int(first[-1]) == tok.eos_token_id
    assert tok.decode(first[:-1]) == train[0]["text"]
