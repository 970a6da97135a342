"""Reading torch distributed checkpoints (DCP) without running code from them.

torch's `FileSystemReader` `pickle.load`s a checkpoint's `.metadata`, and its `DefaultLoadPlanner` loads every
non-tensor value with `torch.load(weights_only=False)`: a crafted checkpoint could run any code on the machine
that reads it. Zebra reads DCP folders (its own checkpoints, Megatron's `torch_dist`) only through:

    SafeFileSystemReader(path)   `.metadata` unpickled with an allow-list of torch's checkpoint metadata classes
                                 (when the reader is made: ZebraError, or pickle.UnpicklingError when corrupt)
    SafeLoadPlanner(path)        non-tensor values loaded with `torch.load(weights_only=True)`

    dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner(path))

Anything else in the file is a one-line ZebraError naming the file and the class.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from zebra.core.errors import ZebraError

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_DCP_PLANNER = "torch.distributed.checkpoint.planner"
# What the `.metadata` of real checkpoints holds (zebra's, and megatron-core's torch_dist, which also stores
# its save plans in `planner_data`); torch dtypes are allowed besides (`torch.float32`, ...).
METADATA_CLASSES = frozenset(
    {
        (_DCP_METADATA, "Metadata"),
        (_DCP_METADATA, "TensorStorageMetadata"),
        (_DCP_METADATA, "TensorProperties"),
        (_DCP_METADATA, "ChunkStorageMetadata"),
        (_DCP_METADATA, "BytesStorageMetadata"),
        (_DCP_METADATA, "MetadataIndex"),
        (_DCP_METADATA, "StorageMeta"),
        (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        (_DCP_PLANNER, "SavePlan"),
        (_DCP_PLANNER, "WriteItem"),
        (_DCP_PLANNER, "WriteItemType"),
        (_DCP_PLANNER, "TensorWriteData"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
    }
)
REFUSAL_FIX = "only load checkpoints from sources you trust; this file holds more than torch checkpoint data"


def refused_global(error: pickle.UnpicklingError) -> str | None:
    """The class or function that `torch.load(weights_only=True)` refused to build, or None (a corrupt file)."""
    # "Unsupported global: GLOBAL x.y was not an allowed global ...", "... unsupported GLOBAL x.y whose module"
    blocked = re.search(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)", str(error))
    return blocked.group(1) if blocked else None


def _allowed(module: str, name: str) -> bool:
    if (module, name) in METADATA_CLASSES:
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only the allow-listed classes (pickle asks `find_class` for every global)."""

    def __init__(self, file, origin: str):
        super().__init__(file)
        self.origin = origin

    def find_class(self, module: str, name: str) -> Any:
        if _allowed(module, name):
            return super().find_class(module, name)
        raise ZebraError(
            f"{self.origin}: refusing to unpickle {module}.{name} (it could run code on this machine)",
            fix=REFUSAL_FIX,
        )


def load_metadata(path: str | Path) -> Metadata:
    """The DCP `Metadata` in file `path` (a `.metadata`), built from allow-listed classes only.

    Raises:
        ZebraError: the file names any other class.
        pickle.UnpicklingError: the file is truncated or corrupt.
        OSError: the file cannot be read (FileNotFoundError: it is missing).
    """
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, str(path)).load()
        except (ZebraError, MemoryError):
            raise
        except Exception as e:  # garbage reaches pickle's opcodes with any exception type
            raise pickle.UnpicklingError(f"{path}: corrupt ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"{path}: holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """torch's `FileSystemReader`, with `.metadata` read by `load_metadata` instead of `pickle.load`.

    The metadata is read when the reader is made, so that its errors reach the caller (inside `dcp.load` a
    failing read is logged with a traceback and retried as per-rank metadata).
    """

    def __init__(self, path: str | Path, **kwargs: Any):
        super().__init__(path, **kwargs)
        self._metadata = load_metadata(self._get_metadata_path())

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = self._metadata
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """torch's `DefaultLoadPlanner`, refusing non-tensor values that `torch.load(weights_only=True)` refuses.

    Args:
        origin: the checkpoint, for error messages.
    """

    def __init__(self, origin: str | Path = "", **kwargs: Any):
        super().__init__(**kwargs)
        self.origin = str(origin)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            if (blocked := refused_global(e)) is None:
                raise  # a corrupt value, not a refused one
            raise ZebraError(
                f"{self.origin}: {read_item.dest_index.fqn}: refusing to unpickle {blocked} "
                "(it could run code on this machine)",
                fix=REFUSAL_FIX,
            ) from None
        value.seek(0)  # checked: what weights_only accepts builds nothing but plain data
        super().load_bytes(read_item, value)
