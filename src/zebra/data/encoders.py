"""A `zebra data prep` worker: raw rows to token ids, with the fastest encoder that gives the tokenizer's own ids.

Each worker process (or the main process, with one worker) is set up once by `init_worker`, then turns batches
of raw rows into flat token arrays with `encode_batch`. On its first documents it picks its encoder: an exact
shortcut (tiktoken for byte-level BPE in Llama-3's form, `zebra.data.fast_bpe`; UTF-8 bytes for the byte
tokenizer, `ByteIds`) when it agrees with `tokenizer(text)["input_ids"]`, else the Rust backend's batched
encoder when that agrees, else the tokenizer's own `__call__`. Every document records which one encoded it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import version
from itertools import chain
from typing import TYPE_CHECKING, Any

from zebra.data.fast_bpe import FastBPE, first_difference
from zebra.data.text_sources import RawBatch, decode_texts
from zebra.data.tokenizers import BYTE_SPECIALS

if TYPE_CHECKING:
    import numpy as np

# How a document was encoded (`EncodedBatch.doc_encoders`, counted per shard in the manifest as `encoders`).
TIKTOKEN, TOKENIZERS, TRANSFORMERS, UTF8 = 0, 1, 2, 3
ENCODERS = ("tiktoken", "tokenizers", "transformers", "utf-8 bytes")

_CHECK_DOCS = 64  # documents of the first batch encoded both ways before the worker trusts a faster encoder
_WORKER: dict[str, Any] = {}


def encoder_name(code: int) -> str:
    """`tiktoken 0.14.0` (the fast BPE core), `tokenizers 0.23.3` (the Rust backend's batched encoder),
    `transformers 5.24.0` (the tokenizer's own `__call__`) or `utf-8 bytes` (the byte tokenizer's ids)."""
    return ENCODERS[code] if code == UTF8 else f"{ENCODERS[code]} {version(ENCODERS[code])}"


@dataclass
class EncodedBatch:
    """A tokenized batch: `tokens` [N] (documents back to back, EOD after each), `lengths` [D],
    `doc_rows` [D] (row offset of each document in the batch), `doc_bytes` [D], `status` [rows],
    `doc_encoders` [D] (`TIKTOKEN`, `TOKENIZERS`, `TRANSFORMERS` or `UTF8`), and `note`: why the worker left
    its exact shortcut aside (only on the batch where it decided)."""

    tokens: np.ndarray
    lengths: np.ndarray
    doc_rows: np.ndarray
    doc_bytes: np.ndarray
    status: np.ndarray
    doc_encoders: np.ndarray
    note: str = ""


class ByteIds:
    """The byte tokenizer's ids without running it: a text's UTF-8 bytes (ids 0..255 are the bytes). A text holding
    a special token's text, which the tokenizer turns into that token's id, is left to the tokenizer.

    Args:
        tokenizer: the byte tokenizer (`byte_tokenizer()`), for those texts and for `check`.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        """Ids of each text, and the indices of the texts the tokenizer itself encoded."""
        hf = [i for i, t in enumerate(texts) if "<|" in t and any(s in t for s in BYTE_SPECIALS)]
        ids = [list(t.encode("utf-8")) for t in texts]
        if hf:
            theirs = self.tokenizer([texts[i] for i in hf], add_special_tokens=True)["input_ids"]
            for i, x in zip(hf, theirs, strict=True):
                ids[i] = list(x)
        return ids, hf

    def check(self, documents: list[str]) -> str:
        """ "" when the ids equal `tokenizer(text)["input_ids"]` on `documents` and adversarial strings."""
        return first_difference(self, self.tokenizer, documents)


def init_worker(
    tokenizer: Any, dtype: str, eod: int, fast_bpe: Any, utf8: bool, subprocess: bool = True
) -> None:
    """Set up this process's encoder state (the pool initializer; `subprocess=False` for the inline pool).

    Args:
        fast_bpe: the plan's `FastBPESpec`, or None.
        utf8: the tokenizer is the byte tokenizer (`ByteIds` is its shortcut).
    """
    if subprocess:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.backend_tokenizer.no_padding()
    _WORKER.update(
        tokenizer=tokenizer, dtype=dtype, eod=eod, spec=fast_bpe, utf8=utf8, encoder=None, code=None
    )


def encode_ids(tokenizer: Any, texts: list[str], fast: bool = True) -> list[list[int]]:
    """Token ids of each text, as `tokenizer(text)["input_ids"]` gives them.

    `fast` calls the Rust backend's batched encoder without offset tracking (`encode_batch_fast`); otherwise
    the tokenizer's own `__call__`, for tokenizer classes that change the text before their backend.
    """
    if fast:
        return [e.ids for e in tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=True)]
    return tokenizer(texts, add_special_tokens=True)["input_ids"]


def pack(ids: list[list[int]], eod: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Documents + EOD back to back: `tokens` [N] in `dtype` and `lengths` [D]."""
    import numpy as np

    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    for x in ids:
        x.append(eod)
    tokens = np.fromiter(chain.from_iterable(ids), dtype=np.dtype(dtype), count=int(lengths.sum()))
    return tokens, lengths


def _choose_encoder(texts: list[str]) -> str:
    """Pick this worker's encoder on its first documents: the plan's exact shortcut (tiktoken for byte-level
    BPE, `zebra.data.fast_bpe`; UTF-8 bytes for the byte tokenizer) when it agrees with the tokenizer, else the
    batched Rust encoder when it agrees, else `__call__`. Returns why the shortcut was left aside, or ""."""
    w, head = _WORKER, texts[:_CHECK_DOCS]
    note = ""
    shortcut = None
    if w["spec"] is not None:
        shortcut = FastBPE(w["spec"], w["tokenizer"]), TIKTOKEN
    elif w["utf8"]:
        shortcut = ByteIds(w["tokenizer"]), UTF8
    if shortcut is not None:
        reason = shortcut[0].check(head)
        if not reason:
            w["encoder"], w["code"] = shortcut
            return ""
        note = f"a worker left the {ENCODERS[shortcut[1]]} encoder aside: {reason}"
    same = encode_ids(w["tokenizer"], head, fast=True) == encode_ids(w["tokenizer"], head, fast=False)
    w["code"] = TOKENIZERS if same else TRANSFORMERS
    return note


def _worker_ids(texts: list[str]) -> tuple[list[list[int]], np.ndarray, str]:
    """Ids of each text with the worker's encoder, each document's encoder code [D], and a note."""
    import numpy as np

    w = _WORKER
    note = _choose_encoder(texts) if w["code"] is None and texts else ""
    code = TOKENIZERS if w["code"] is None else w["code"]
    if w["encoder"] is None:
        ids = encode_ids(w["tokenizer"], texts, fast=code == TOKENIZERS)
        return ids, np.full(len(texts), code, np.uint8), note
    ids, diverted = w["encoder"].encode(texts)
    codes = np.full(len(texts), code, np.uint8)
    codes[diverted] = TRANSFORMERS
    return ids, codes, note


def encode_batch(batch: RawBatch) -> EncodedBatch:
    """Decode, tokenize and pack one batch of raw rows with this worker's encoder (runs in the worker)."""
    import numpy as np

    texts, status, sizes = decode_texts(batch)
    ids, doc_encoders, note = _worker_ids(texts)
    tokens, lengths = pack(ids, _WORKER["eod"], _WORKER["dtype"])
    status_arr = np.array(status, dtype=np.uint8)
    doc_rows = np.flatnonzero(status_arr == 0).astype(np.int64)
    return EncodedBatch(
        tokens, lengths, doc_rows, np.array(sizes, dtype=np.int64), status_arr, doc_encoders, note
    )
