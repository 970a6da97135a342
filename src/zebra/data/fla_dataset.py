"""`zebra data convert-fla`: FLA's preprocessed Arrow dataset to Megatron shards, chunk for chunk.

FLA's `legacy/training/preprocess.py` (and flame's) tokenizes a corpus after `dataset.shuffle(seed=42)`,
concatenates the token streams without EOD and cuts them into fixed `seq_len` (2048) chunks, saved with
`Dataset.save_to_disk` as Arrow files with an `input_ids` list column (and optionally `offsets`). Each chunk
becomes one Megatron document, in the same order, so a model trained from the Megatron copy sees exactly
FLA's order of chunks. After writing, every shard is read back through megatron-core's `IndexedDataset` and
compared with the Arrow data token for token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zebra.data.tokenizers as tok
from zebra import __version__
from zebra.core.errors import ZebraError
from zebra.data.folder import FolderResult, ShardFolder, resume_manifest
from zebra.data.indexed import open_dataset
from zebra.data.manifest import Manifest, read_manifest
from zebra.data.text_sources import arrow_batches

ROWS_PER_SHARD = 500_000  # ~1B tokens of 2048-token chunks
COLUMN = "input_ids"


@dataclass
class FlaFolderResult(FolderResult):
    """What `convert_fla` left in the folder, and how many tokens it compared with the Arrow data."""

    verified_tokens: int


def fla_arrow_files(arrow_dir: str | Path, split: str | None = None) -> list[Path]:
    """The Arrow files of a `save_to_disk` Dataset, or of `split` (default `train`) in a DatasetDict, in row order.

    Raises:
        ZebraError: not a folder of Arrow files, no `input_ids` column, a DatasetDict without `split`, or a
            `split` for a plain Dataset (which has none: its rows would be converted whatever the split said).
    """
    root = Path(arrow_dir).expanduser()
    if not root.is_dir():
        raise ZebraError(f"{arrow_dir}: no such folder", fix="pass the folder FLA's preprocess.py saved")
    if (root / "dataset_dict.json").exists():
        splits = _splits(root)
        split = split or "train"
        if split not in splits:
            raise ZebraError(f"{arrow_dir}: no split {split!r} (has {', '.join(splits)})", fix="pass --split")
        root = root / split
    elif split is not None:
        raise ZebraError(
            f"--split {split}: {arrow_dir} is a plain Dataset, not a DatasetDict with splits",
            fix=_split_fix(root, split),
        )
    if (root / "state.json").exists():
        files = [root / f["filename"] for f in json.loads((root / "state.json").read_text())["_data_files"]]
    else:
        files = sorted(root.glob("*.arrow"))
    if not files:
        raise ZebraError(f"{arrow_dir}: no .arrow files", fix="pass the folder FLA's preprocess.py saved")
    schema = next(iter(arrow_batches(files[0]))).schema
    if COLUMN not in schema.names:
        raise ZebraError(
            f"{files[0].name}: no '{COLUMN}' column (has {', '.join(schema.names)})",
            fix="convert-fla reads FLA's tokenized output; for raw text use `zebra data prep --source`",
        )
    return [f.resolve() for f in files]


def _splits(root: Path) -> list[str]:
    return json.loads((root / "dataset_dict.json").read_text()).get("splits", [])


def _split_fix(dataset: Path, split: str) -> str:
    """Leave --split out, or (for a split folder of a DatasetDict) pass the DatasetDict folder with it."""
    parent = dataset.resolve().parent
    if (parent / "dataset_dict.json").exists():
        return (
            f"leave --split out to convert this folder, or pass the DatasetDict folder {parent} with --split "
            f"(it has {', '.join(_splits(parent))})"
        )
    return "leave --split out: the whole Dataset is converted"


def _chunks(files: list[Path]) -> Iterator[Any]:
    """`input_ids` columns (pyarrow ListArrays) of every record batch, in row order."""
    for path in files:
        for rb in arrow_batches(path):
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
    split: str | None = None,
    rows_per_shard: int = ROWS_PER_SHARD,
    force: bool = False,
    on_progress: Callable[..., None] | None = None,
) -> FlaFolderResult:
    """Write FLA's chunks as Megatron shards in `output` (a data folder), then verify them token for token.

    Args:
        arrow_dir: the folder FLA's preprocess saved (Dataset or DatasetDict).
        output: data folder; shards `NAME_00000.bin/.idx` and `manifest.json` (resumable like prep).
        tokenizer: the tokenizer FLA used (recorded for inspect; sets the dtype). Without it the dtype comes
            from the largest id in the data.
        dtype: `auto`, `uint16` or `int32`.
        split: the split of a DatasetDict (default `train`); none for a plain Dataset.
        rows_per_shard: chunks per shard.
        force: replace a folder holding other data.
        on_progress: called as `on_progress(chunks done, total chunks, tok=tokens done)`.
    """
    files = fla_arrow_files(arrow_dir, split)
    total_rows = sum(len(c) for c in _chunks(files))
    max_id = max((int(_flat(c)[0].max(initial=0)) for c in _chunks(files)), default=0)
    tokenizer_info, vocab = _tokenizer(tokenizer, max_id, arrow_dir)
    folder = Path(output).expanduser().resolve()
    fresh = Manifest(
        # `train` for a plain Dataset too, as before --split was checked: a folder started then still resumes
        source={
            "kind": "fla-arrow",
            "name": str(Path(arrow_dir).expanduser().resolve()),
            "split": split or "train",
        },
        tokenizer=tokenizer_info,
        dtype=tok.token_dtype(vocab, dtype).name,
        config={"kind": "convert-fla", "rows_per_shard": rows_per_shard},
        zebra_version=__version__,
    )
    with ShardFolder(folder, resume_manifest(folder, fresh, force=force), force=force) as shards:
        _write_chunks(shards, files, total_rows, rows_per_shard, on_progress)
    verified = verify_against_arrow(folder, files)
    return FlaFolderResult(**vars(shards.result()), verified_tokens=verified)


def _tokenizer(name: str | None, max_id: int, arrow_dir: str | Path) -> tuple[dict[str, Any], int]:
    """The manifest's tokenizer entry (empty without a tokenizer) and the vocabulary the dtype must hold."""
    if name is None:
        return {}, max_id + 1
    loaded = tok.load_tokenizer(name)
    vocab = tok.vocab_size(loaded)
    if max_id >= vocab:
        raise ZebraError(
            f"{arrow_dir}: token id {max_id} is outside the {vocab}-id vocabulary of {name}",
            fix="pass the --tokenizer FLA's preprocess used",
        )
    return tok.tokenizer_record(name, loaded, eod=False), vocab


def _write_chunks(
    shards: ShardFolder,
    files: list[Path],
    total_rows: int,
    rows_per_shard: int,
    on_progress: Callable[..., None] | None,
) -> None:
    """Each chunk from the folder's resume point on as one document, shard `i` holding chunks `[i*R, (i+1)*R)`."""
    import numpy as np

    manifest = shards.manifest
    dtype = np.dtype(manifest.dtype)
    tokens_done = manifest.tokens
    first_row = 0
    for row, column in _pieces(files, manifest.rows, rows_per_shard):
        if shards.writer is None:
            shards.open_shard(row // rows_per_shard)
            first_row = row
        tokens, lengths = _flat(column)
        shards.writer.add_documents(tokens.astype(dtype), lengths)
        tokens_done += int(tokens.size)
        end = row + len(column)
        if end % rows_per_shard == 0 or end == total_rows:
            stats = {"first_row": first_row, "rows": end - first_row, "bytes": 0, "skipped": {}}
            shards.commit(complete=end == total_rows, **stats)
        if on_progress is not None:
            on_progress(end, total_rows, tok=tokens_done)
    if not manifest.complete:  # nothing left to write (empty data, or every shard was already there)
        shards.mark_complete()


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
