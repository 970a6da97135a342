"""`zebra data prep`: tokenize a corpus into resumable Megatron shards.

Flow: the main process reads the source in row order and hands batches of raw rows to worker processes
(`zebra.data.encoders`), which decode them, tokenize them, append EOD and return flat token arrays; the main
process writes them, in order, through megatron-core's `IndexedDatasetBuilder`. The manifest counts each
shard's documents per encoder.

Resumability follows `zebra.data.folder`: rows `[i * R, (i + 1) * R)` always form shard `i`, committed shards
are kept on a re-run and the rest regenerated, so no document is lost or repeated.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zebra.data.tokenizers as tok
from zebra import __version__
from zebra.core.atomic import check_output_apart, write_error
from zebra.core.cpus import usable_cpus
from zebra.core.errors import ZebraError
from zebra.data.encoders import ENCODERS, EncodedBatch, encode_batch, encoder_name, init_worker
from zebra.data.fast_bpe import FastBPESpec, fast_bpe_spec
from zebra.data.folder import FolderResult, ShardFolder, folder_lock, resume_manifest
from zebra.data.indexed import megatron_indexed
from zebra.data.manifest import Manifest, manifest_path, read_manifest
from zebra.data.text_sources import STATUS_NAMES, RawBatch, Source

if TYPE_CHECKING:
    import numpy as np

DEFAULT_ROWS_PER_SHARD = 100_000
BATCH_ROWS = 256


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
    notes: list[str] = field(default_factory=list)  # for the user; `run_prep` adds what it finds

    @property
    def name(self) -> str:
        return self.folder.name


def plan_prep(
    source: Source,
    output: str | Path,
    *,
    tokenizer: str = "meta-llama/Llama-3.2-1B",
    workers: int | None = None,
    max_docs: int | None = None,
    max_tokens: float | None = None,
    shards: int | None = None,
    dtype: str = "auto",
    force: bool = False,
    nominal_tokens: float | None = None,
) -> PrepPlan:
    """Load the tokenizer, size the shards and check the output folder (resume or start fresh).

    Args:
        source: from `open_source` / `fineweb_sample_source`.
        output: the data folder; shards become `FOLDER/NAME_00000.bin/.idx` (NAME = the folder's name).
        tokenizer: HF tokenizer name or path, or `byte`.
        workers: tokenizer processes (default: all cores).
        max_docs / max_tokens: stop after this many source rows / once this many tokens are written
            (`max_tokens` may be a float such as 1e9; it must be finite).
        shards: number of shards (needs a known row count); default one shard per 100k rows.
        dtype: `auto`, `uint16` or `int32`.
        force: replace a folder that holds different data instead of failing.
        nominal_tokens: expected token count (FineWeb-Edu samples), for the disk-space check.

    Raises:
        ZebraError: bad numbers, an output that is, holds or lies in the source (whatever `force` says), a
            folder another prep is writing, a tokenizer that does not fit the dtype, a
            folder with other data, no disk space.
    """
    max_tokens = _token_count(max_tokens)
    _check_counts(workers=workers, max_docs=max_docs, max_tokens=max_tokens, shards=shards)
    folder = Path(output).expanduser().resolve()
    local = source.name if source.kind == "local" else None
    check_output_apart(
        folder,
        {"--source": local, "--tokenizer": tokenizer},
        harm="its shards would land among the files being read",
    )
    folder_lock(folder).check()  # another prep writing it: said before a question, a tokenizer or the hub
    tokenizer_obj = tok.load_tokenizer(tokenizer)
    np_dtype = tok.token_dtype(tok.vocab_size(tokenizer_obj), dtype)
    existing = None if force or not manifest_path(folder).exists() else read_manifest(folder)
    source.pin(existing.source if existing is not None else None)  # a resume reads the rows it started on
    total = source.count_rows()
    if max_docs is not None:
        total = min(total, max_docs) if total is not None else max_docs
    rows_per_shard = _rows_per_shard(existing, shards, total)
    shards_note = _fewer_shards_note(shards, total, rows_per_shard)
    config = {
        "kind": "prep",
        "text_field": source.text_field,
        "rows_per_shard": rows_per_shard,
        "max_docs": max_docs,
        "max_tokens": max_tokens,
    }
    fresh = Manifest(
        source=source.describe(),
        tokenizer=tok.tokenizer_record(tokenizer, tokenizer_obj),
        dtype=np_dtype.name,
        config=config,
        zebra_version=__version__,
    )
    manifest = resume_manifest(folder, fresh, force=force)
    budget = max_tokens or nominal_tokens
    estimated = int(budget * np_dtype.itemsize * 1.05) if budget else None
    if estimated and not manifest.complete:
        _check_disk(folder, estimated - manifest.tokens * np_dtype.itemsize)
    fast, notes = (None, []) if manifest.complete else _fast_bpe(tokenizer, tokenizer_obj)
    if shards_note and not manifest.complete:
        notes.insert(0, shards_note)
    return PrepPlan(
        source=source,
        tokenizer=tokenizer_obj,
        tokenizer_name=tokenizer,
        folder=folder,
        dtype=np_dtype,
        workers=workers or usable_cpus(),
        rows_per_shard=rows_per_shard,
        total_rows=total,
        max_docs=max_docs,
        max_tokens=max_tokens,
        manifest=manifest,
        fast_bpe=fast,
        estimated_bytes=estimated,
        resumed=existing is not None,
        force=force,
        notes=notes,
    )


def _fast_bpe(name: str, tokenizer: Any) -> tuple[FastBPESpec | None, list[str]]:
    """The tiktoken encoder for a byte-level BPE tokenizer of the supported form, or a note on why there is none."""
    if name == tok.BYTE_TOKENIZER:
        return None, []  # its shortcut is its UTF-8 bytes (`zebra.data.encoders.ByteIds`)
    fast, reason = fast_bpe_spec(tokenizer)
    if fast is None:
        return None, [f"tokenizing with `tokenizers`, not the faster tiktoken encoder: {reason}"]
    return fast, []


def _token_count(value: float | None) -> int | None:
    """`--max-tokens` as a whole number of tokens (`1e9` -> 1000000000); `inf` and `nan` are refused."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise ZebraError(
            f"--max-tokens {value}: not a finite number",
            fix="pass a token count such as 1e9, or leave it out",
        )
    return int(value)


# the most tokenizer processes and shards a prep makes: far above a machine's cores and any corpus's needs, low
# enough that a typo does not fork a million processes or create a million files
MAX_COUNTS = {"workers": 1024, "shards": 100_000}


def _check_counts(**flags: int | None) -> None:
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is not None and value < 1:
            raise ZebraError(
                f"{flag} {value}: must be at least 1", fix=f"pass a positive {flag} or leave it out"
            )
        if value is not None and value > MAX_COUNTS.get(name, value):
            raise ZebraError(
                f"{flag} {value}: above the most zebra takes, {MAX_COUNTS[name]:,}",
                fix=f"pass a smaller {flag} or leave it out",
            )


def _rows_per_shard(existing: Manifest | None, shards: int | None, total: int | None) -> int:
    """The folder's own sharding on a re-run without --shards, else `total / shards`, else the default."""
    if existing is not None and shards is None:
        return existing.config.get("rows_per_shard", DEFAULT_ROWS_PER_SHARD)
    if shards is None:
        return DEFAULT_ROWS_PER_SHARD
    if total is None:
        raise ZebraError(
            "--shards needs the number of documents, which this source does not say",
            fix="add --max-docs, or leave --shards out (one shard per 100k documents)",
        )
    return max(1, math.ceil(total / shards))


def _fewer_shards_note(shards: int | None, total: int | None, rows_per_shard: int) -> str | None:
    """What `--shards N` became when it makes fewer than N shards, and why (None when it makes N).

    Shard `i` holds rows `[i * R, (i + 1) * R)` with `R = ceil(total / N)` whole documents, so `ceil(total / R)`
    shards are enough: fewer than N when there are fewer documents than shards (one per document), or when
    the rounding up leaves the last shards empty (10 documents, --shards 8: 2 per shard, 5 shards).
    """
    if shards is None or not total:
        return None
    made = math.ceil(total / rows_per_shard)
    if made >= shards:
        return None
    if rows_per_shard == 1:
        return f"--shards {shards}: {made} shard(s), one per document (only {total:,} documents)"
    rest = total - (made - 1) * rows_per_shard
    last = f", the last {rest:,}" if rest != rows_per_shard else ""
    return (
        f"--shards {shards}: {made} shards of {rows_per_shard:,} documents{last} (every shard but the last "
        f"holds ceil({total:,} / {shards}) = {rows_per_shard:,} documents, so {total:,} documents fill {made})"
    )


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


def run_prep(
    plan: PrepPlan,
    on_progress: Callable[..., None] | None = None,
    on_resume: Callable[[int, int], None] | None = None,
) -> FolderResult:
    """Tokenize the planned rows into shards; resumes from the shards the manifest already lists.

    Args:
        on_progress: called as `on_progress(done, total, docs=..., tok=..., MB=...)`, at most ten times a
            second: `done` of `total` counts tokens when `max_tokens` bounds the run, else source rows (`total`
            None when unknown); docs, tok and MB are the documents, tokens and megabytes of text so far.
        on_resume: called as `on_resume(kept, tokens)` (shards and their tokens) when the run keeps shards an
            earlier run committed: only once the folder is locked and those shards are checked, so a folder
            another prep is writing fails first.

    Returns:
        What the folder holds now; its `notes` are `plan.notes`, with what the run found added.
    """
    try:
        with ShardFolder(plan.folder, plan.manifest, force=plan.force, notes=plan.notes) as shards:
            if on_resume is not None and shards.kept:
                on_resume(shards.kept, shards.manifest.tokens)
            if not plan.manifest.complete:
                megatron_indexed()  # import megatron-core (seconds) before the workers start, not while they run
                utf8 = plan.tokenizer_name == tok.BYTE_TOKENIZER
                initargs = (
                    plan.tokenizer,
                    plan.dtype.str,
                    plan.manifest.tokenizer["eod_id"],
                    plan.fast_bpe,
                    utf8,
                )
                if plan.workers == 1:
                    pool = _InlinePool(initargs)
                else:
                    ctx = (
                        mp.get_context("fork")
                        if "fork" in mp.get_all_start_methods()
                        else mp.get_context("spawn")
                    )
                    pool = ctx.Pool(plan.workers, initializer=init_worker, initargs=initargs)
                try:
                    _Run(plan, pool, shards, on_progress).execute()
                finally:
                    pool.terminate()
                    pool.join()
    except OSError as e:  # a full disk, a read-only folder: the shards committed so far stay, a rerun resumes
        if isinstance(e, BrokenPipeError):
            raise
        raise write_error(
            plan.folder, e, fix="free some space (or choose another --output); a rerun resumes"
        ) from None
    return shards.result()


class _Run:
    """One pass over the remaining rows: submit batches to the pool, write results in order."""

    def __init__(
        self, plan: PrepPlan, pool: Any, shards: ShardFolder, on_progress: Callable[..., None] | None
    ) -> None:
        self.plan, self.pool, self.shards, self.on_progress = plan, pool, shards, on_progress
        self.shard_index = -1
        self.shard_stats: dict[str, Any] = {}
        self.done = False
        m = shards.manifest
        self.rows, self.documents, self.tokens = m.rows, m.documents, m.tokens  # so far, committed included
        self.bytes = sum(s.bytes for s in m.shards)
        self._last_report = 0.0

    def execute(self) -> None:
        plan = self.plan
        pending: deque = deque()
        max_inflight = 2 * plan.workers + 2
        self._report(force=True)
        for piece in self._pieces(self.rows):
            pending.append((piece, self.pool.apply_async(encode_batch, (piece,))))
            while len(pending) >= max_inflight and not self.done:
                self._write(*_get(pending.popleft()))
            if self.done:
                break
        while pending and not self.done:
            self._write(*_get(pending.popleft()))
        if not self.done:
            self._close_shard(final=True)
        self._report(force=True)

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

    def _write(self, piece: RawBatch, encoded: EncodedBatch) -> None:
        import numpy as np

        shard_index = piece.start // self.plan.rows_per_shard
        if shard_index != self.shard_index:
            if self.shards.writer is not None:
                self._close_shard(final=False)
            self._open_shard(shard_index)
        rows, lengths, tokens = len(piece), encoded.lengths, encoded.tokens
        status, doc_bytes, doc_encoders = encoded.status, encoded.doc_bytes, encoded.doc_encoders
        if encoded.note and encoded.note not in self.plan.notes:
            self.plan.notes.append(encoded.note)
        budget = self.plan.max_tokens
        if budget is not None and self.tokens + int(lengths.sum()) >= budget:
            # keep documents up to the one that reaches the budget, then stop
            keep = int(np.searchsorted(np.cumsum(lengths), budget - self.tokens)) + 1
            rows = int(encoded.doc_rows[keep - 1]) + 1
            lengths, doc_bytes, status = lengths[:keep], doc_bytes[:keep], status[:rows]
            doc_encoders = doc_encoders[:keep]
            tokens = tokens[: int(lengths.sum())]
            self.done = True
        self.shards.writer.add_documents(tokens, lengths)
        self._count(rows, lengths, doc_bytes, status, doc_encoders)
        self._report()
        if self.done:
            self._close_shard(final=True)

    def _count(self, rows: int, lengths: Any, doc_bytes: Any, status: Any, doc_encoders: Any) -> None:
        """Add written rows to the shard's statistics (skipped rows by reason, documents by encoder) and totals."""
        import numpy as np

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
        self.rows += rows
        self.documents += len(lengths)
        self.tokens += int(lengths.sum())
        self.bytes += int(doc_bytes.sum())

    def _open_shard(self, index: int) -> None:
        self.shards.open_shard(index)
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
        if self.shards.writer is not None:
            self.shards.commit(complete=final, **self.shard_stats)
        elif final:
            self.shards.mark_complete()

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is not None and (force or now - self._last_report > 0.1):
            self._last_report = now
            budget = self.plan.max_tokens
            done, total = (self.tokens, budget) if budget else (self.rows, self.plan.total_rows)
            self.on_progress(done, total, docs=self.documents, tok=self.tokens, MB=self.bytes / 1e6)


def _get(item: tuple[RawBatch, Any]) -> tuple[RawBatch, EncodedBatch]:
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
        init_worker(*initargs, subprocess=False)

    def apply_async(self, fn: Callable, args: tuple) -> _Done:
        return self._Done(fn(*args))

    def terminate(self) -> None:
        pass

    def join(self) -> None:
        pass
