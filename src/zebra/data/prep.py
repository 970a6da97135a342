"""`zebra data prep`: tokenize a corpus into resumable Megatron shards.

Flow: the main process reads the source in row order and hands batches of raw rows to worker processes,
which decode them, tokenize them, append EOD and return flat token arrays; the main process writes them, in
order, through megatron-core's `IndexedDatasetBuilder`. Each worker encodes with the first of these that gives
`tokenizer(text)["input_ids"]` on its first documents: an exact shortcut (tiktoken for byte-level BPE in
Llama-3's form, `zebra.data.fast_bpe`; UTF-8 bytes for the byte tokenizer), the Rust backend's batched encoder,
or the tokenizer's own `__call__`. The manifest counts each shard's documents per encoder.

Resumability follows `zebra.data.folder`: rows `[i * R, (i + 1) * R)` always form shard `i`, committed shards
are kept on a re-run and the rest regenerated, so no document is lost or repeated.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra import __version__
from zebra.data import tokenizers as tok
from zebra.data.folder import (
    clear_folder,
    commit_shard,
    remove_temporaries,
    resume_manifest,
    shard_name,
    verify_committed,
)
from zebra.data.manifest import Manifest, manifest_path, read_manifest, write_manifest
from zebra.data.sources import SAMPLE_TOKENS, STATUS_NAMES, RawBatch, Source, decode_texts
from zebra.errors import ZebraError

if TYPE_CHECKING:
    import numpy as np

    from zebra.data.fast_bpe import FastBPESpec

DEFAULT_ROWS_PER_SHARD = 100_000
BATCH_ROWS = 256


@dataclass
class PrepProgress:
    """Counts so far (committed shards included); `total_rows` / `max_tokens` are None when unknown."""

    rows: int
    total_rows: int | None
    documents: int
    tokens: int
    bytes: int
    max_tokens: int | None


@dataclass
class PrepPlan:
    """Everything decided before any work starts; `run_prep` executes it."""

    source: Source
    tokenizer: Any
    tokenizer_name: str
    folder: Path
    dtype: np.dtype
    workers: int
    rows_per_shard: int
    total_rows: int | None
    max_docs: int | None
    max_tokens: int | None
    manifest: Manifest
    fast_bpe: FastBPESpec | None = None  # tiktoken encoder for this tokenizer, when it has the supported form
    estimated_bytes: int | None = None
    resumed: bool = False
    force: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.folder.name


@dataclass
class PrepResult:
    manifest: Manifest
    folder: Path
    shards_written: int
    shards_kept: int
    seconds: float


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plan_prep(
    source: Source,
    output: str | Path,
    *,
    tokenizer: str = "meta-llama/Llama-3.2-1B",
    workers: int | None = None,
    max_docs: int | None = None,
    max_tokens: int | None = None,
    shards: int | None = None,
    dtype: str = "auto",
    force: bool = False,
    nominal_tokens: float | None = None,
) -> PrepPlan:
    """Load the tokenizer, size the shards and check the output folder (resume or start fresh).

    Args:
        source: from `open_source` / `sample_source`.
        output: the data folder; shards become `FOLDER/NAME_00000.bin/.idx` (NAME = the folder's name).
        tokenizer: HF tokenizer name or path, or `byte`.
        workers: tokenizer processes (default: all cores).
        max_docs / max_tokens: stop after this many source rows / once this many tokens are written.
        shards: number of shards (needs a known row count); default one shard per 100k rows.
        dtype: `auto`, `uint16` or `int32`.
        force: replace a folder that holds different data instead of failing.
        nominal_tokens: expected token count (FineWeb-Edu samples), for the disk-space check.

    Raises:
        ZebraError: bad numbers, a tokenizer that does not fit the dtype, a folder with other data, no disk space.
    """
    for flag, value in (
        ("--workers", workers),
        ("--max-docs", max_docs),
        ("--max-tokens", max_tokens),
        ("--shards", shards),
    ):
        if value is not None and value < 1:
            raise ZebraError(
                f"{flag} {value}: must be at least 1", fix=f"pass a positive {flag} or leave it out"
            )
    folder = Path(output).expanduser().resolve()
    tokenizer_obj = tok.load_tokenizer(tokenizer)
    vocab = tok.vocab_size(tokenizer_obj)
    np_dtype = tok.token_dtype(vocab, dtype)
    tokenizer_info = {
        "name": tokenizer,
        "vocab_size": vocab,
        "vocab_hash": tok.vocab_hash(tokenizer_obj),
        "eod_id": tok.eod_id(tokenizer_obj),
    }
    existing = None if force or not manifest_path(folder).exists() else read_manifest(folder)
    total = source.count_rows()
    if max_docs is not None:
        total = min(total, max_docs) if total is not None else max_docs
    if existing is not None and shards is None:
        rows_per_shard = existing.config.get("rows_per_shard", DEFAULT_ROWS_PER_SHARD)
    elif shards is not None:
        if total is None:
            raise ZebraError(
                "--shards needs the number of documents, which this source does not say",
                fix="add --max-docs, or leave --shards out (one shard per 100k documents)",
            )
        rows_per_shard = max(1, math.ceil(total / shards))
    else:
        rows_per_shard = DEFAULT_ROWS_PER_SHARD
    config = {
        "kind": "prep",
        "text_field": source.text_field,
        "rows_per_shard": rows_per_shard,
        "max_docs": max_docs,
        "max_tokens": max_tokens,
    }
    fresh = Manifest(
        source=source.describe(),
        tokenizer=tokenizer_info,
        dtype=np_dtype.name,
        config=config,
        zebra_version=__version__,
    )
    fresh = resume_manifest(folder, fresh, force=force)
    budget = max_tokens or nominal_tokens
    estimated = int(budget * np_dtype.itemsize * 1.05) if budget else None
    if estimated and not fresh.complete:
        _check_disk(folder, estimated - fresh.tokens * np_dtype.itemsize)
    fast, notes = None, []
    if not fresh.complete and tokenizer != tok.BYTE_TOKENIZER:
        from zebra.data.fast_bpe import fast_bpe_spec

        fast, reason = fast_bpe_spec(tokenizer_obj)
        if fast is None:
            notes.append(f"tokenizing with `tokenizers`, not the faster tiktoken encoder: {reason}")
    return PrepPlan(
        source=source,
        tokenizer=tokenizer_obj,
        tokenizer_name=tokenizer,
        folder=folder,
        dtype=np_dtype,
        workers=workers or default_workers(),
        rows_per_shard=rows_per_shard,
        total_rows=total,
        max_docs=max_docs,
        max_tokens=max_tokens,
        manifest=fresh,
        fast_bpe=fast,
        estimated_bytes=estimated,
        resumed=existing is not None,
        force=force,
        notes=notes,
    )


def sample_nominal_tokens(sample: str) -> float:
    return SAMPLE_TOKENS[sample]


def _check_disk(folder: Path, needed: int) -> None:
    probe = folder
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise ZebraError(
            f"{folder}: needs about {needed / 1e9:.0f} GB of disk, {free / 1e9:.0f} GB free",
            fix="free some space, choose another --output, or limit the job with --max-tokens",
        )


# --- execution -----------------------------------------------------------------------------------------


def run_prep(plan: PrepPlan, on_progress: Callable[[PrepProgress], None] | None = None) -> PrepResult:
    """Tokenize the planned rows into shards; resumes from the shards the manifest already lists."""
    import multiprocessing as mp

    start = time.monotonic()
    folder = plan.folder
    folder.mkdir(parents=True, exist_ok=True)
    if plan.force:
        clear_folder(folder)
    manifest = plan.manifest
    plan.notes += verify_committed(folder, manifest)
    kept = len(manifest.shards)
    write_manifest(folder, manifest)
    written = 0
    if not manifest.complete:
        from zebra.data.indexed import megatron_indexed

        megatron_indexed()  # import megatron-core (seconds) before the workers start, not while they run
        utf8 = plan.tokenizer_name == tok.BYTE_TOKENIZER
        initargs = (plan.tokenizer, plan.dtype.str, manifest.tokenizer["eod_id"], plan.fast_bpe, utf8)
        if plan.workers == 1:
            pool = _InlinePool(initargs)
        else:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
            pool = ctx.Pool(plan.workers, initializer=_init_worker, initargs=initargs)
        try:
            written = _Run(plan, pool, on_progress).execute()
        finally:
            pool.terminate()
            pool.join()
    remove_temporaries(folder)
    return PrepResult(manifest, folder, written, kept, time.monotonic() - start)


class _Run:
    """One pass over the remaining rows: submit batches to the pool, write results in order."""

    def __init__(self, plan: PrepPlan, pool: Any, on_progress: Callable[[PrepProgress], None] | None) -> None:
        self.plan, self.pool, self.on_progress = plan, pool, on_progress
        self.manifest = plan.manifest
        self.writer = None  # ShardWriter of the current shard
        self.shard_index = -1
        self.shard_stats: dict[str, Any] = {}
        self.written = 0
        self.done = False
        m = self.manifest
        self.progress = PrepProgress(
            m.rows, plan.total_rows, m.documents, m.tokens, sum(s.bytes for s in m.shards), plan.max_tokens
        )
        self._last_report = 0.0

    def execute(self) -> int:
        plan = self.plan
        start_row = self.manifest.rows
        pending: deque = deque()
        max_inflight = 2 * plan.workers + 2
        self._report(force=True)
        try:
            for piece in self._pieces(start_row):
                pending.append((piece, self.pool.apply_async(_encode, (piece,))))
                while len(pending) >= max_inflight and not self.done:
                    self._write(*_get(pending.popleft()))
                if self.done:
                    break
            while pending and not self.done:
                self._write(*_get(pending.popleft()))
            if not self.done:
                self._close_shard(final=True)
        except BaseException:
            if self.writer is not None:
                self.writer.discard()
            raise
        self._report(force=True)
        return self.written

    def _pieces(self, start_row: int):
        """Source batches cut at shard boundaries and at --max-docs."""
        plan = self.plan
        limit = plan.max_docs
        for batch in plan.source.batches(start_row, BATCH_ROWS):
            lo = 0
            while lo < len(batch):
                row = batch.start + lo
                if limit is not None and row >= limit:
                    return
                shard_end = (row // plan.rows_per_shard + 1) * plan.rows_per_shard
                hi = min(len(batch), shard_end - batch.start)
                if limit is not None:
                    hi = min(hi, limit - batch.start)
                yield batch.slice(lo, hi)
                lo = hi

    def _write(self, piece: RawBatch, encoded: _Encoded) -> None:
        import numpy as np

        shard_index = piece.start // self.plan.rows_per_shard
        if shard_index != self.shard_index:
            if self.writer is not None:
                self._close_shard(final=False)
            self._open_shard(shard_index)
        rows, lengths, tokens = len(piece), encoded.lengths, encoded.tokens
        status, doc_bytes, doc_encoders = encoded.status, encoded.doc_bytes, encoded.doc_encoders
        if encoded.note and encoded.note not in self.plan.notes:
            self.plan.notes.append(encoded.note)
        budget = self.plan.max_tokens
        if budget is not None and self.progress.tokens + int(lengths.sum()) >= budget:
            # keep documents up to the one that reaches the budget, then stop
            keep = int(np.searchsorted(np.cumsum(lengths), budget - self.progress.tokens)) + 1
            rows = int(encoded.doc_rows[keep - 1]) + 1
            lengths, doc_bytes, status = lengths[:keep], doc_bytes[:keep], status[:rows]
            doc_encoders = doc_encoders[:keep]
            tokens = tokens[: int(lengths.sum())]
            self.done = True
        self.writer.add_documents(tokens, lengths)
        stats = self.shard_stats
        stats["rows"] += rows
        stats["bytes"] += int(doc_bytes.sum())
        for code, count in enumerate(np.bincount(status, minlength=len(STATUS_NAMES) + 1)):
            if code and count:
                name = STATUS_NAMES[code]
                stats["skipped"][name] = stats["skipped"].get(name, 0) + int(count)
        for code, count in enumerate(np.bincount(doc_encoders, minlength=len(ENCODERS))):
            if count:
                name = encoder_name(code)
                stats["encoders"][name] = stats["encoders"].get(name, 0) + int(count)
        p = self.progress
        p.rows += rows
        p.documents += len(lengths)
        p.tokens += int(lengths.sum())
        p.bytes += int(doc_bytes.sum())
        self._report()
        if self.done:
            self._close_shard(final=True)

    def _open_shard(self, index: int) -> None:
        from zebra.data.indexed import ShardWriter

        self.writer = ShardWriter(self.plan.folder / shard_name(self.plan.folder, index), self.plan.dtype)
        self.shard_index = index
        self.shard_stats = {
            "first_row": index * self.plan.rows_per_shard,
            "rows": 0,
            "bytes": 0,
            "skipped": {},
            "encoders": {},
        }

    def _close_shard(self, final: bool) -> None:
        """Commit and record the current shard; `final` also marks the manifest complete."""
        if final:
            self.manifest.complete = True
        if self.writer is not None:
            commit_shard(self.plan.folder, self.manifest, self.writer, **self.shard_stats)
            self.writer = None
            self.written += 1
        else:
            write_manifest(self.plan.folder, self.manifest)

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is not None and (force or now - self._last_report > 0.1):
            self._last_report = now
            self.on_progress(self.progress)


def _get(item: tuple[RawBatch, Any]) -> tuple[RawBatch, _Encoded]:
    piece, result = item
    try:
        return piece, result.get()
    except OverflowError:
        raise ZebraError(
            "the tokenizer produced ids beyond the token dtype", fix="use --dtype int32 (or auto)"
        ) from None


class _InlinePool:
    """`--workers 1`: encode in this process (no fork), with the pool's interface."""

    class _Done:
        def __init__(self, value: Any) -> None:
            self.value = value

        def get(self) -> Any:
            return self.value

    def __init__(self, initargs: tuple) -> None:
        _init_worker(*initargs, subprocess=False)

    def apply_async(self, fn: Callable, args: tuple) -> _Done:
        return self._Done(fn(*args))

    def terminate(self) -> None:
        pass

    def join(self) -> None:
        pass


# --- worker side ---------------------------------------------------------------------------------------


# How a document was encoded (`_Encoded.doc_encoders`, counted per shard in the manifest as `encoders`).
TIKTOKEN, TOKENIZERS, TRANSFORMERS, UTF8 = 0, 1, 2, 3
ENCODERS = ("tiktoken", "tokenizers", "transformers", "utf-8 bytes")


def encoder_name(code: int) -> str:
    """`tiktoken 0.14.0` (the fast BPE core), `tokenizers 0.23.3` (the Rust backend's batched encoder),
    `transformers 5.24.0` (the tokenizer's own `__call__`) or `utf-8 bytes` (the byte tokenizer's ids)."""
    from importlib.metadata import version

    return ENCODERS[code] if code == UTF8 else f"{ENCODERS[code]} {version(ENCODERS[code])}"


@dataclass
class _Encoded:
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


_WORKER: dict[str, Any] = {}
_CHECK_DOCS = 64  # documents of the first batch encoded both ways before the worker trusts a faster encoder


def _init_worker(
    tokenizer: Any, dtype: str, eod: int, fast_bpe: Any, utf8: bool, subprocess: bool = True
) -> None:
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
    from itertools import chain

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
    from zebra.data.fast_bpe import FastBPE
    from zebra.data.tokenizers import ByteIds

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


def _encode(batch: RawBatch) -> _Encoded:
    import numpy as np

    texts, status, sizes = decode_texts(batch)
    ids, doc_encoders, note = _worker_ids(texts)
    tokens, lengths = pack(ids, _WORKER["eod"], _WORKER["dtype"])
    status_arr = np.array(status, dtype=np.uint8)
    doc_rows = np.flatnonzero(status_arr == 0).astype(np.int64)
    return _Encoded(
        tokens, lengths, doc_rows, np.array(sizes, dtype=np.int64), status_arr, doc_encoders, note
    )
