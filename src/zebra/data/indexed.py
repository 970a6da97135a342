"""Megatron indexed datasets (`PREFIX.bin` + `PREFIX.idx`) through megatron-core's own builder and reader.

Writing goes to temporary names (`PREFIX.tmp.bin/.idx`) and `commit` renames them into place, so a reader never
sees a half-written file. `check_prefix` validates sizes against the index (a truncated `.bin` or `.idx` is an
error, never garbage tokens).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import numpy as np

_IDX_HEADER = b"MMIDIDX\x00\x00"
_IDX_FIXED = 9 + 8 + 1 + 8 + 8  # header, version, dtype code, sequence count, document count
_DTYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}  # megatron DType codes -> bytes


def megatron_indexed():
    """`megatron.core.datasets.indexed_dataset`, imported quietly (megatron warns about missing Apex/TE)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def tmp_prefix(prefix: str | Path) -> str:
    return f"{prefix}.tmp"


class ShardWriter:
    """Append documents to one Megatron shard under temporary names; `finish` + `commit` publish it.

    Args:
        prefix: final prefix (no extension); data goes to `prefix.tmp.bin` until committed.
        dtype: token dtype (`numpy.uint16` or `numpy.int32`).
    """

    def __init__(self, prefix: str | Path, dtype: np.dtype) -> None:
        import numpy as np

        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        self._tmp = tmp_prefix(prefix)
        self._builder = megatron_indexed().IndexedDatasetBuilder(self._tmp + ".bin", dtype=self.dtype.type)
        self.documents = 0
        self.tokens = 0

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents stored back to back.

        Args:
            tokens: `[N]` token ids in `self.dtype`, the documents concatenated (EOD included).
            lengths: `[D]` tokens per document, summing to N.
        """
        offset = 0
        for length in lengths.tolist():
            self._builder.add_document(tokens[offset : offset + length], [length])
            offset += length
        self.documents += len(lengths)
        self.tokens += offset

    def finish(self) -> dict:
        """Write the index, flush both files to disk and return their sizes and sha256 checksums."""
        self._builder.finalize(self._tmp + ".idx")
        info = {}
        for ext in ("bin", "idx"):
            path = self._tmp + "." + ext
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
            info[f"{ext}_bytes"] = os.path.getsize(path)
            info[f"{ext}_sha256"] = sha256_file(path)
        return info

    def commit(self) -> None:
        """Rename the finished temporary files to their final names (`.idx` last)."""
        os.replace(self._tmp + ".bin", self.prefix + ".bin")
        os.replace(self._tmp + ".idx", self.prefix + ".idx")

    def discard(self) -> None:
        with contextlib.suppress(OSError):  # its last buffered bytes may not fit either (a full disk)
            self._builder.data_file.close()
        for ext in ("bin", "idx"):
            Path(self._tmp + "." + ext).unlink(missing_ok=True)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class IndexInfo:
    """What a `.idx` file says about its `.bin`."""

    dtype_code: int
    itemsize: int
    sequences: int
    documents: int
    tokens: int


def check_prefix(prefix: str | Path) -> IndexInfo:
    """Validate `PREFIX.idx` and `PREFIX.bin` without trusting either: header, exact sizes, token total.

    Raises:
        ZebraError: a file is missing, the index is corrupt, or either file is truncated.
    """
    import numpy as np

    prefix = str(prefix)
    idx, bin_ = Path(prefix + ".idx"), Path(prefix + ".bin")
    for path in (idx, bin_):
        if not path.is_file():
            raise ZebraError(
                f"{path}: missing", fix=f"pass the prefix of an existing .bin/.idx pair (got {prefix})"
            )
    idx_size = idx.stat().st_size
    with open(idx, "rb") as f:
        head = f.read(_IDX_FIXED)
        if len(head) < _IDX_FIXED or head[:9] != _IDX_HEADER:
            raise ZebraError(f"{idx}: not a Megatron index (bad or truncated header)", fix=_REGENERATE)
        (dtype_code,) = struct.unpack("<B", head[17:18])
        sequences, documents = struct.unpack("<QQ", head[18:34])
        if dtype_code not in _DTYPE_SIZES:
            raise ZebraError(f"{idx}: unknown token dtype code {dtype_code}", fix=_REGENERATE)
        expected = _IDX_FIXED + 12 * sequences + 8 * documents
        if idx_size < expected:
            raise ZebraError(f"{idx}: truncated ({idx_size} of {expected} bytes)", fix=_REGENERATE)
        lengths = np.fromfile(f, dtype=np.int32, count=sequences)
    itemsize = _DTYPE_SIZES[dtype_code]
    tokens = int(lengths.sum(dtype=np.int64))
    bin_size = bin_.stat().st_size
    if bin_size != tokens * itemsize:
        state = "truncated" if bin_size < tokens * itemsize else "longer than its index says"
        raise ZebraError(
            f"{bin_}: {state} ({bin_size} bytes, the index says {tokens * itemsize})", fix=_REGENERATE
        )
    return IndexInfo(dtype_code, itemsize, sequences, documents - 1, tokens)


_REGENERATE = "delete it and re-run the `zebra data prep` (or convert-fla) command that made it"


def open_dataset(prefix: str | Path):
    """megatron-core's `IndexedDataset` for a validated prefix (memory-mapped)."""
    check_prefix(prefix)
    return megatron_indexed().IndexedDataset(str(prefix), mmap=True)
