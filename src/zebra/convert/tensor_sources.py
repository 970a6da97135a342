"""Lazy tensor sources: list names and shapes first, read one tensor at a time.

Every checkpoint reader exposes the same three things: `shapes()` (name -> (shape, dtype), in file order,
without reading data), `get(name)` (one tensor) and `close()`. Converters stack a `ConvertedSource` on top to
rename / split / reshape, so a conversion never holds more than one source tensor and its pieces.

Readers:
    SafetensorsSource   model.safetensors or a sharded index (safetensors `safe_open`, memory-mapped)
    StateDictSource     an in-memory or memory-mapped dict (`torch.load(mmap=True)`, a live `state_dict()`)
    DCPSource           a torch.distributed.checkpoint directory, read key by key on CPU without a process group
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from zebra.convert.keymap import Piece
from zebra.core.errors import ZebraError, error_summary, first_line

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


class TensorSource:
    """Base class: `origin` names the file or directory in error messages."""

    origin: str = ""

    def shapes(self) -> Shapes:
        raise NotImplementedError

    def get(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StateDictSource(TensorSource):
    """A mapping of tensors (a live `state_dict()` or a memory-mapped `torch.load`); non-tensors are skipped."""

    def __init__(self, tensors: Mapping[str, Any], origin: str = "state dict"):
        self.tensors = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        self.origin = origin

    def shapes(self) -> Shapes:
        return {k: (tuple(v.shape), v.dtype) for k, v in self.tensors.items()}

    def get(self, name: str) -> torch.Tensor:
        return self.tensors[name].detach()


class SafetensorsSource(TensorSource):
    """`model.safetensors` or `model.safetensors.index.json` + shards in `directory` (or one .safetensors file)."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        path = Path(path)
        self.origin = str(path)
        if path.is_file():
            files = {path.name: path}
        else:
            index = path / "model.safetensors.index.json"
            if index.is_file():
                try:
                    weight_map = json.loads(index.read_text())["weight_map"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ZebraError(
                        f"{index}: not a safetensors index ({e})", fix="re-export or re-download the model"
                    ) from None
                files = {name: path / name for name in dict.fromkeys(weight_map.values())}
            elif (path / "model.safetensors").is_file():
                files = {"model.safetensors": path / "model.safetensors"}
            else:
                raise ZebraError(
                    f"{path}: no model.safetensors", fix="point at a directory with safetensors weights"
                )
        self._handles: dict[str, Any] = {}
        self._file_of: dict[str, str] = {}  # tensor name -> shard file name
        for name, file in files.items():
            if not file.is_file():
                raise ZebraError(f"{file}: missing shard", fix="copy the complete checkpoint directory")
            try:
                handle = safe_open(str(file), framework="pt")
            except Exception as e:  # safetensors raises its own SafetensorError for truncated / corrupt files
                raise ZebraError(
                    f"{file}: unreadable safetensors file ({first_line(e)})",
                    fix="the file is truncated or corrupt; copy or download it again",
                ) from None
            self._handles[name] = handle
            for key in handle.keys():  # noqa: SIM118  (safe_open handles are not mappings)
                self._file_of[key] = name

    def shapes(self) -> Shapes:
        out: Shapes = {}
        for key, name in self._file_of.items():
            sl = self._handles[name].get_slice(key)
            out[key] = (tuple(sl.get_shape()), SAFETENSORS_DTYPES[sl.get_dtype()])
        return out

    def get(self, name: str) -> torch.Tensor:
        return self._handles[self._file_of[name]].get_tensor(name)

    def close(self) -> None:
        for handle in self._handles.values():
            exit_ = getattr(handle, "__exit__", None)
            if exit_ is not None:
                exit_(None, None, None)
        self._handles = {}


class DCPSource(TensorSource):
    """A torch.distributed.checkpoint directory, read one tensor per `dcp.load` call on CPU.

    Args:
        directory: holds `.metadata` and `__*_*.distcp` files.
        accept: which checkpoint keys are model tensors; returns the name to expose, or None to skip
            (optimizer state, RNG state, TE extra state, ...).
        hold: a descriptor holding the checkpoint against pruning (`zebra.folders.checkpoint_dir.read_hold`), closed
            by `close()`.
    """

    def __init__(self, directory: Path, accept, *, hold: int | None = None):
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from zebra.core.safe_dcp import SafeFileSystemReader

        self.origin = str(directory)
        self.directory = Path(directory)
        self._hold = hold
        try:
            self._reader = SafeFileSystemReader(str(directory))  # reads .metadata without running code
            metadata = self._reader.read_metadata()
            self._metadata = metadata
        except ZebraError:
            raise
        except Exception as e:
            raise ZebraError(
                f"{directory}/.metadata: unreadable distributed-checkpoint metadata ({type(e).__name__})",
                fix="the checkpoint is incomplete or corrupt; use another checkpoint",
            ) from None
        self._keys: dict[str, str] = {}
        self._meta: Shapes = {}
        for key, md in metadata.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                continue
            name = accept(key)
            if name is None:
                continue
            self._keys[name] = key
            self._meta[name] = (tuple(md.size), md.properties.dtype)

    def shapes(self) -> Shapes:
        return dict(self._meta)

    def get(self, name: str) -> torch.Tensor:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        shape, dtype = self._meta[name]
        key = self._keys[name]
        out = {key: torch.empty(shape, dtype=dtype)}
        try:
            with (
                warnings.catch_warnings()
            ):  # "no process group, assuming a single process": exactly the intent
                warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
                dcp.load(out, storage_reader=self._reader, no_dist=True)
        except (Exception, CheckpointException) as e:  # CheckpointException derives from BaseException
            if isinstance(e, CheckpointException):  # the first rank's own exception says what went wrong
                failure = next(iter(e.failures.values()), e)  # (exception, its stack) in torch 2.x
                e = failure[0] if isinstance(failure, tuple) else getattr(failure, "exception", failure)
            files = self._files_of(key)
            named = getattr(e, "filename", None) or (files[0] if len(files) == 1 else None)
            where = f" from {Path(named).name}" if named else ""
            raise ZebraError(
                f"{self.directory}: cannot read {key}{where} ({error_summary(e)})",
                fix=f"{Path(named).name if named else 'a .distcp file'} is truncated or missing; "
                "use a complete checkpoint",
            ) from None
        return out[key]

    def _files_of(self, key: str) -> list[str]:
        """The .distcp files holding `key`'s data (from the metadata's storage index)."""
        storage = getattr(self._metadata, "storage_data", None) or {}
        return sorted(
            {
                str(getattr(info, "relative_path", ""))
                for index, info in storage.items()
                if getattr(index, "fqn", None) == key and getattr(info, "relative_path", None)
            }
        )

    def close(self) -> None:
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None


class ConvertedSource(TensorSource):
    """Pieces of another source under new names; one source tensor is cached while its pieces are read."""

    def __init__(self, base: TensorSource, pieces: list[Piece]):
        self.base = base
        self.origin = base.origin
        self.pieces = {p.name: p for p in pieces}
        if len(self.pieces) != len(pieces):
            seen: set[str] = set()
            dup = next(p for p in pieces if p.name in seen or seen.add(p.name))  # type: ignore[func-returns-value]
            raise ZebraError(
                f"{base.origin}: two tensors map to {dup.name}",
                fix="the checkpoint holds the same weight under two names; remove one",
            )
        self._cached: tuple[str, torch.Tensor] | None = None

    def shapes(self) -> Shapes:
        return {p.name: (p.shape, p.dtype) for p in self.pieces.values()}

    def get(self, name: str) -> torch.Tensor:
        piece = self.pieces[name]
        if self._cached is None or self._cached[0] != piece.source:
            self._cached = None  # drop the previous tensor before reading the next
            self._cached = (piece.source, self.base.get(piece.source))
        t = self._cached[1]
        return piece.transform(t) if piece.transform else t

    def close(self) -> None:
        self._cached = None
        self.base.close()


class _Inert:
    """Stands in for a class pickled inside a checkpoint's saved arguments; its code is never imported or run."""

    qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any):
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.qualname}>"


# what torch.load raises on a file that is not a torch checkpoint (text, random bytes, a truncated legacy pickle):
# its weights-only unpickler reads whatever opcodes and memo indices the bytes spell
NOT_A_CHECKPOINT = (EOFError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError)


def torch_load(path: Path, *, mmap: bool = True) -> Any:
    """`torch.load` with `weights_only=True` (tensors memory-mapped), never `weights_only=False`.

    Megatron checkpoints pickle an `argparse.Namespace` of arguments that may hold enums and other classes.
    `argparse.Namespace` is allow-listed; any other class named in the file is replaced by an inert
    placeholder (`_Inert`), so no code from the checkpoint's modules runs.
    """
    import torch.serialization as ser

    path = Path(path)
    try:
        with ser.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except pickle.UnpicklingError:
        pass
    except RuntimeError as e:
        if mmap and "mmap" in str(e):  # legacy (non-zip) serialization cannot be memory-mapped
            return torch_load(path, mmap=False)
        raise _unreadable(path, e) from None
    except NOT_A_CHECKPOINT as e:
        raise _unreadable(path, e) from None
    try:
        unknown = [n for n in ser.get_unsafe_globals_in_checkpoint(path) if n != "argparse.Namespace"]
        stand_ins = [(type("Inert", (_Inert,), {"qualname": n}), n) for n in unknown]
        with ser.safe_globals([argparse.Namespace, *stand_ins]):
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, *NOT_A_CHECKPOINT) as e:
        raise _unreadable(path, e) from None


def _unreadable(path: Path, error: Exception) -> ZebraError:
    text = str(error)
    blocked = re.search(r"unsupported GLOBAL (\S+) whose module \S+ is blocked", text)
    if blocked:
        return ZebraError(
            f"{path}: refusing to unpickle {blocked.group(1)} (it could run code on this machine)",
            fix="only load checkpoints from sources you trust; re-save the weights without that object",
        )
    return ZebraError(
        f"{path}: unreadable torch checkpoint ({error_summary(error)})",
        fix="the file is truncated or corrupt; copy it again or use another checkpoint",
    )
