"""Small corpora in every source format, and the two tokenizers the data tests run with (built offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zebra.data.bundled_corpus import generate_documents

# Varied text: the generated corpus plus the hard cases (non-ASCII, emoji, control characters, special-token text).
EXTRA_TEXTS = [
    "Grüße aus Köln — naïve café, 東京タワー, 🦓🦓 zebra!",
    "tabs\tand\nnew lines\r\n and a NUL \x00 byte",
    "A literal <|endoftext|> inside a document.",
    "x",
]


@pytest.fixture(scope="session")
def texts() -> list[str]:
    docs = list(generate_documents(seed=7, num_documents=180))
    return docs[:60] + EXTRA_TEXTS + docs[60:]


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory, texts) -> Path:
    """A byte-level BPE tokenizer (vocab 600) trained offline on the test corpus, saved in HF layout."""
    from zebra.data.tokenizers import train_bpe

    path = tmp_path_factory.mktemp("bpe")
    train_bpe(texts, 600).save_pretrained(path)
    return path


@pytest.fixture(params=["byte", "bpe"])
def tokenizer_name(request, bpe_dir) -> str:
    return "byte" if request.param == "byte" else str(bpe_dir)


@pytest.fixture(autouse=True)
def zebra_cache(tmp_path_factory, monkeypatch) -> Path:
    path = tmp_path_factory.getbasetemp() / "zebra-cache"
    monkeypatch.setenv("ZEBRA_CACHE", str(path))
    return path
