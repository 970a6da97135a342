"""`zebra bench data`: our prep throughput against Megatron's preprocess_data approach, same corpus and tokenizer.

Baseline (what `tools/preprocess_data.py` does): a multiprocessing pool maps JSON lines to workers with
`imap(chunksize=32)`; each worker parses the line and calls the tokenizer once per document
(`tokenizer(text)["input_ids"]` + EOD); the main process writes every document with `IndexedDatasetBuilder`.
Ours: `zebra.data.prep` (tiktoken as the BPE core where it is exact for the tokenizer, else the Rust backend's
batched encoder without offsets; flat arrays back to the writer).
Both use the same worker count and write the same dtype; their outputs are compared byte for byte.
Rounds alternate baseline / ours and the best time of each counts, which damps noise from other load.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing as mp
import os
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import zebra.data.tokenizers as tok
from zebra.core.cpus import usable_cpus
from zebra.core.errors import ZebraError, first_line
from zebra.data.bundled_corpus import CORPUS_PATH
from zebra.data.indexed import megatron_indexed, open_dataset
from zebra.data.prep import plan_prep, run_prep
from zebra.data.text_sources import open_source

_BASELINE: dict[str, Any] = {}


@dataclass
class DataBenchResult:
    corpus: str
    corpus_bytes: int
    documents: int
    tokens: int
    tokenizer: str
    workers: int
    rounds: int
    baseline_seconds: float
    ours_seconds: float
    baseline_cpu_seconds: float  # main process + workers, user + system
    ours_cpu_seconds: float
    identical_output: bool
    encoders: dict[str, int]  # documents per encoder in our output (manifest.json's per-shard counts, summed)

    @property
    def baseline_tokens_per_s(self) -> float:
        return self.tokens / self.baseline_seconds

    @property
    def ours_tokens_per_s(self) -> float:
        return self.tokens / self.ours_seconds

    @property
    def speedup(self) -> float:
        return self.baseline_seconds / self.ours_seconds

    @property
    def per_core_speedup(self) -> float:
        """Tokens per CPU-second, ours over baseline: the per-core figure, insensitive to other load."""
        return self.baseline_cpu_seconds / self.ours_cpu_seconds

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d |= {
            "baseline_tokens_per_s": self.baseline_tokens_per_s,
            "ours_tokens_per_s": self.ours_tokens_per_s,
            "baseline_tokens_per_cpu_s": self.tokens / self.baseline_cpu_seconds,
            "ours_tokens_per_cpu_s": self.tokens / self.ours_cpu_seconds,
            "speedup": self.speedup,
            "per_core_speedup": self.per_core_speedup,
        }
        return d


def bench_data(
    corpus: str | Path | None = None,
    *,
    tokenizer: str = "byte",
    train_bpe: int | None = None,
    workers: int | None = None,
    repeat: int = 8,
    rounds: int = 3,
    on_phase: Callable[[str], None] | None = None,
) -> DataBenchResult:
    """Time both pipelines on one jsonl corpus.

    Args:
        corpus: a jsonl file with a `text` field (default: the bundled corpus, `repeat` times over).
        tokenizer: tokenizer name or path, or `byte`.
        train_bpe: instead of `tokenizer`, train a byte-level BPE of this vocabulary on the corpus (offline) in
            Llama-3's form: its regex split, its ranked merges, a bos (`zebra.data.tokenizers.train_bpe`).
        workers: worker processes for both (default: all cores).
        repeat: copies of the bundled corpus when no corpus is given.
        rounds: alternating runs of each pipeline; the fastest of each is reported.
        on_phase: called with a short description of what runs now.
    """
    say = on_phase or (lambda _msg: None)
    workers = workers or usable_cpus()
    megatron_indexed()  # import once, outside the timings
    with tempfile.TemporaryDirectory(prefix="zebra-bench-data-") as tmp_dir:
        tmp = Path(tmp_dir)
        path = check_corpus(Path(corpus)) if corpus else _bundled_jsonl(tmp / "corpus.jsonl", repeat)
        name = tokenizer
        if train_bpe:
            say(f"training a {train_bpe}-token BPE on the corpus")
            texts = [json.loads(line)["text"] for line in path.open("rb")]
            trained = tok.train_bpe(texts, train_bpe, split="llama3", ranked=True, bos=True)
            trained.save_pretrained(tmp / "bpe")
            tokenizer = str(tmp / "bpe")
            name = f"Llama-3-style BPE trained on the corpus ({tok.vocab_size(trained):,} ids)"
        loaded = tok.load_tokenizer(tokenizer)
        dtype = tok.token_dtype(tok.vocab_size(loaded))
        base, mine = [float("inf")] * 2, [float("inf")] * 2  # best (wall, cpu) seconds of each
        for r in range(rounds):
            say(f"round {r + 1}/{rounds}: baseline (per-document encode, {workers} workers)")
            with _Clock() as clock:
                documents, tokens = _baseline(path, loaded, dtype, workers, tmp / "baseline")
            base = [min(base[0], clock.wall), min(base[1], clock.cpu)]
            say(f"round {r + 1}/{rounds}: zebra data prep ({workers} workers)")
            ours = tmp / "ours"
            plan = plan_prep(open_source(str(path)), ours, tokenizer=tokenizer, workers=workers, force=True)
            with _Clock() as clock:
                result = run_prep(plan)
            mine = [min(mine[0], clock.wall), min(mine[1], clock.cpu)]
        identical = (result.manifest.documents, result.manifest.tokens) == (
            documents,
            tokens,
        ) and _same_output(tmp / "baseline", ours, result.manifest)
        corpus_bytes = path.stat().st_size
    return DataBenchResult(
        corpus=str(corpus) if corpus else f"bundled corpus x{repeat}",
        corpus_bytes=corpus_bytes,
        documents=documents,
        tokens=tokens,
        tokenizer=name,
        workers=workers,
        rounds=rounds,
        baseline_seconds=base[0],
        ours_seconds=mine[0],
        baseline_cpu_seconds=base[1],
        ours_cpu_seconds=mine[1],
        identical_output=identical,
        encoders=_encoders(result.manifest),
    )


def check_corpus(path: Path) -> Path:
    """`path` when it is a readable jsonl file with a string `text` on every line (what both pipelines read).

    Raises:
        ZebraError: naming `--corpus` and the first bad line.
    """
    fix = 'pass a jsonl file with one {"text": "..."} object per line'
    try:
        with path.open("rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    row = json.loads(line)
                except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                    raise ZebraError(
                        f"--corpus {path}: line {number} is not JSON ({first_line(e)})", fix=fix
                    ) from None
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise ZebraError(f"--corpus {path}: line {number} has no string 'text' field", fix=fix)
    except OSError as e:
        raise ZebraError(f"--corpus {path}: {e.strerror or first_line(e)}", fix=fix) from None
    return path


def _encoders(manifest: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for shard in manifest.shards:
        for name, count in shard.encoders.items():
            total[name] = total.get(name, 0) + count
    return total


class _Clock:
    """Wall seconds and CPU seconds (this process + the worker processes it reaped) of a block."""

    def __enter__(self) -> _Clock:
        self._wall, self._cpu = time.perf_counter(), _cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = _cpu_seconds() - self._cpu


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _bundled_jsonl(path: Path, repeat: int) -> Path:
    data = gzip.decompress(CORPUS_PATH.read_bytes())
    with open(path, "wb") as f:
        for _ in range(repeat):
            f.write(data)
    return path


def _baseline_init(tokenizer: Any, eod: int) -> None:
    _BASELINE.update(tokenizer=tokenizer, eod=eod)


def _baseline_encode(line: str) -> list[int]:
    text = json.loads(line)["text"]
    ids = _BASELINE["tokenizer"](text)["input_ids"]
    ids.append(_BASELINE["eod"])
    return ids


def _baseline(path: Path, tokenizer: Any, dtype: Any, workers: int, prefix: Path) -> tuple[int, int]:
    """Megatron preprocess_data's loop: Pool.imap over lines, one encode per document, add_document each."""
    builder = megatron_indexed().IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype.type)
    documents = tokens = 0
    ctx = mp.get_context("fork")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with (
        open(path, encoding="utf-8") as fin,
        ctx.Pool(workers, initializer=_baseline_init, initargs=(tokenizer, tokenizer.eos_token_id)) as pool,
    ):
        for ids in pool.imap(_baseline_encode, fin, 32):
            builder.add_document(ids, [len(ids)])
            documents += 1
            tokens += len(ids)
        pool.close()
        pool.join()  # reap the workers so their CPU time is counted
    builder.finalize(f"{prefix}.idx")
    return documents, tokens


def _same_output(baseline: Path, folder: Path, manifest: Any) -> bool:
    """Our shards, concatenated, hold exactly the baseline's token bytes and document lengths."""
    import numpy as np

    def lengths(prefix: Path) -> np.ndarray:
        ds = open_dataset(prefix)  # its arrays view a memory map that closes with it: copy
        return np.array(ds.sequence_lengths, copy=True)

    prefixes = [folder / s.prefix for s in manifest.shards]
    ours = b"".join(Path(f"{p}.bin").read_bytes() for p in prefixes)
    ours_lengths = np.concatenate([lengths(p) for p in prefixes])
    return ours == Path(f"{baseline}.bin").read_bytes() and np.array_equal(ours_lengths, lengths(baseline))
