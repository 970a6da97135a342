"""`zebra data convert-fla`: FLA's preprocessed Arrow dataset to Megatron shards, chunk for chunk.

FLA's `legacy/training/preprocess.py` (and flame's) tokenizes a corpus after `dataset.shuffle(seed=42)`,
concatenates the token streams without EOD and cuts them into fixed `seq_len` (2048) chunks, saved with
`Dataset.save_to_disk` as Arrow files with an `input_ids` list column (and optionally `offsets`). Each chunk
becomes one Megatron document, in the same order, so a model trained from the Megatron copy sees exactly
FLA's sample order. After writing, every shard is read back through megatron-core's `IndexedDataset` and
compared with the Arrow data token for token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from zebra import __version__
from zebra.errors import ZebraError

ROWS_PER_SHARD = 500_000  # ~1B tokens of 2048-token chunks
COLUMN = "input_ids"


def fla_arrow_files(arrow_dir: str | Path, split: str = "train") -> list[Path]:
    """The Arrow files of a `save_to_disk` Dataset (or of `split` in a DatasetDict), in row order.

    Raises:
        ZebraError: not a folder of Arrow files, or no `input_ids` column.
    """
    import json

    root = Path(arrow_dir).expanduser()
    if not root.is_dir():
        raise ZebraError(f"{arrow_dir}: no such folder", fix="pass the folder FLA's preprocess.py saved")
    if (root / "dataset_dict.json").exists():
        splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits:
            raise ZebraError(f"{arrow_dir}: no split {split!r} (has {', '.join(splits)})", fix="pass --split")
        root = root / split
    if (root / "state.json").exists():
        files = [root / f["filename"] for f in json.loads((root / "state.json").read_text())["_data_files"]]
    else:
        files = sorted(root.glob("*.arrow"))
    if not files:
        raise ZebraError(f"{arrow_dir}: no .arrow files", fix="pass the folder FLA's preprocess.py saved")
    from zebra.data.sources import _arrow_batches

    schema = next(iter(_arrow_batches(files[0]))).schema
    if COLUMN not in schema.names:
        raise ZebraError(
            f"{files[0].name}: no '{COLUMN}' column (has {', '.join(schema.names)})",
            fix="convert-fla reads FLA's tokenized output; for raw text use `zebra data prep --source`",
        )
    return [f.resolve() for f in files]


def _chunks(files: list[Path]) -> Iterator[Any]:
    """`input_ids` columns (pyarrow ListArrays) of every record batch, in row order."""
    from zebra.data.sources import _arrow_batches

    for path in files:
        for rb in _arrow_batches(path):
            yield rb.column(COLUMN)


def _flat(column: Any) -> tuple[Any, Any]:
    """`tokens` [N] (int64) and `lengths` [R] of a list column slice."""
    import numpy as np
    import pyarrow.compute as pc

    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    tokens = column.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return tokens, lengths


def convert_fla(
    arrow_dir: str | Path,
    output: str | Path,
    *,
    tokenizer: str | None = None,
    dtype: str = "auto",
    split: str = "train",
    rows_per_shard: int = ROWS_PER_SHARD,
    force: bool = False,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> dict[str, Any]:
    """Write FLA's chunks as Megatron shards in `output` (a data folder), then verify them token for token.

    Args:
        arrow_dir: the folder FLA's preprocess saved (Dataset or DatasetDict).
        output: data folder; shards `NAME_00000.bin/.idx` and `manifest.json` (resumable like prep).
        tokenizer: the tokenizer FLA used (recorded for inspect; sets the dtype). Without it the dtype comes
            from the largest id in the data.
        dtype: `auto`, `uint16` or `int32`.
        split: the split of a DatasetDict.
        rows_per_shard: chunks per shard.
        force: replace a folder holding other data.
        on_progress: called with (rows done, total rows, tokens done).

    Returns:
        {"manifest", "verified_tokens", "seconds", "shards_written", "notes"}
    """
    from zebra.data import tokenizers as tok
    from zebra.data.folder import (
        clear_folder,
        commit_shard,
        remove_temporaries,
        resume_manifest,
        shard_name,
        verify_committed,
    )
    from zebra.data.indexed import ShardWriter
    from zebra.data.manifest import Manifest, write_manifest

    start = time.monotonic()
    files = fla_arrow_files(arrow_dir, split)
    total_rows = sum(len(c) for c in _chunks(files))
    max_id = max((int(_flat(c)[0].max(initial=0)) for c in _chunks(files)), default=0)
    tokenizer_info: dict[str, Any] = {}
    vocab = max_id + 1
    if tokenizer is not None:
        loaded = tok.load_tokenizer(tokenizer)
        vocab = tok.vocab_size(loaded)
        tokenizer_info = {
            "name": tokenizer,
            "vocab_size": vocab,
            "vocab_hash": tok.vocab_hash(loaded),
            "eod_id": None,
        }
        if max_id >= vocab:
            raise ZebraError(
                f"{arrow_dir}: token id {max_id} is outside the {vocab}-id vocabulary of {tokenizer}",
                fix="pass the --tokenizer FLA's preprocess used",
            )
    np_dtype = tok.token_dtype(vocab, dtype)
    folder = Path(output).expanduser().resolve()
    fresh = Manifest(
        source={"kind": "fla-arrow", "name": str(Path(arrow_dir).expanduser().resolve()), "split": split},
        tokenizer=tokenizer_info,
        dtype=np_dtype.name,
        config={"kind": "convert-fla", "rows_per_shard": rows_per_shard},
        zebra_version=__version__,
    )
    manifest = resume_manifest(folder, fresh, force=force)
    folder.mkdir(parents=True, exist_ok=True)
    if force:
        clear_folder(folder)
    notes = verify_committed(folder, manifest)
    write_manifest(folder, manifest)
    kept = len(manifest.shards)
    tokens_done = manifest.tokens
    writer = None
    for row, column in _pieces(files, manifest.rows, rows_per_shard):
        index = row // rows_per_shard
        if writer is None:
            writer, first_row = ShardWriter(folder / shard_name(folder, index), np_dtype), row
        tokens, lengths = _flat(column)
        writer.add_documents(tokens.astype(np_dtype), lengths)
        tokens_done += int(tokens.size)
        end = row + len(column)
        if end % rows_per_shard == 0 or end == total_rows:
            manifest.complete = end == total_rows
            commit_shard(
                folder, manifest, writer, first_row=first_row, rows=end - first_row, bytes=0, skipped={}
            )
            writer = None
        if on_progress is not None:
            on_progress(end, total_rows, tokens_done)
    if not manifest.complete:  # nothing left to write (empty data, or every shard was already there)
        manifest.complete = True
        write_manifest(folder, manifest)
    remove_temporaries(folder)
    verified = verify_against_arrow(folder, files)
    return {
        "manifest": manifest,
        "verified_tokens": verified,
        "seconds": time.monotonic() - start,
        "shards_written": len(manifest.shards) - kept,
        "notes": notes,
    }


def _pieces(files: list[Path], start_row: int, rows_per_shard: int) -> Iterator[tuple[int, Any]]:
    """(first row, `input_ids` slice) from `start_row` on, cut at shard boundaries."""
    row = 0
    for column in _chunks(files):
        lo = max(0, start_row - row)
        while lo < len(column):
            r = row + lo
            hi = min(len(column), (r // rows_per_shard + 1) * rows_per_shard - row)
            yield r, column.slice(lo, hi - lo)
            lo = hi
        row += len(column)


def verify_against_arrow(folder: Path, files: list[Path]) -> int:
    """Read every shard back with megatron-core's `IndexedDataset` and compare with the Arrow chunks.

    Returns:
        The number of tokens compared.

    Raises:
        ZebraError: the first chunk whose tokens or length differ.
    """
    import numpy as np

    from zebra.data.indexed import open_dataset
    from zebra.data.manifest import read_manifest

    manifest = read_manifest(folder)
    shards = iter(manifest.shards)
    shard, ds, doc = None, None, 0
    row = compared = 0
    for column in _chunks(files):
        tokens, lengths = _flat(column)
        offset = 0
        for length in lengths.tolist():
            while ds is None or doc >= len(ds):
                shard = next(shards, None)
                if shard is None:
                    raise ZebraError(f"{folder}: fewer documents than the Arrow data has rows", fix=_FIX)
                ds, doc = open_dataset(folder / shard.prefix), 0
            got = ds[doc]
            if len(got) != length or not np.array_equal(got, tokens[offset : offset + length]):
                raise ZebraError(f"{folder}: document {row} differs from Arrow row {row}", fix=_FIX)
            offset += length
            compared += length
            doc += 1
            row += 1
    if (ds is not None and doc < len(ds)) or next(shards, None) is not None:
        raise ZebraError(f"{folder}: more documents than the Arrow data has rows", fix=_FIX)
    return compared


_FIX = "delete the output folder and run convert-fla again"
