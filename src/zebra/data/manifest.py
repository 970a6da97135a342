"""`manifest.json`: what a prepared data folder holds, and how the trainer finds its shards.

A data folder made by `zebra data prep` (or `convert-fla`) holds `NAME_00000.bin/.idx`, ... and a
`manifest.json` listing every committed shard with its source rows, document and token counts and sha256
checksums, plus the source, tokenizer (name and vocabulary hash), dtype and zebra version. The manifest is
rewritten atomically after each shard is committed, so it always describes exactly the shards on disk.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from zebra.core.errors import ZebraError

MANIFEST = "manifest.json"
FORMAT = "zebra-megatron-shards"
FORMAT_VERSION = 1


@dataclass
class Shard:
    """One committed shard: source rows `[first_row, first_row + rows)` became `documents` documents."""

    prefix: str  # file name stem inside the folder, e.g. "edu_00003"
    first_row: int
    rows: int
    documents: int
    tokens: int
    bytes: int  # UTF-8 bytes of the text that went in
    skipped: dict[str, int]
    bin_bytes: int
    idx_bytes: int
    bin_sha256: str
    idx_sha256: str
    encoders: dict[str, int] = field(
        default_factory=dict
    )  # documents per encoder, e.g. {"tiktoken 0.14.0": 9}


@dataclass
class Manifest:
    """The whole folder. `config` holds everything that must match for a re-run to resume."""

    source: dict[str, Any]
    tokenizer: dict[str, Any]  # name, vocab_size, vocab_hash, eod_id
    dtype: str
    config: dict[str, Any]  # text_field, rows_per_shard, max_docs, max_tokens, kind
    zebra_version: str
    complete: bool = False
    shards: list[Shard] = field(default_factory=list)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def skipped(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for s in self.shards:
            for k, v in s.skipped.items():
                total[k] = total.get(k, 0) + v
        return total

    def check_has_documents(self, folder: Path) -> None:
        """A data folder without a document is nothing to train on: a ZebraError for `folder` then."""
        if self.documents == 0:
            read = f"{self.rows:,} row(s) read, all skipped" if self.rows else "the source holds no rows"
            raise ZebraError(
                f"{folder}: no document was written ({read})",
                fix="check --text-field, and that the source holds UTF-8 text",
            )

    def to_json(self) -> dict:
        d = asdict(self)
        d["totals"] = {
            "documents": self.documents,
            "tokens": self.tokens,
            "rows": self.rows,
            "skipped": self.skipped(),
        }
        return d


def manifest_path(folder: str | Path) -> Path:
    return Path(folder) / MANIFEST


def write_manifest(folder: str | Path, manifest: Manifest) -> None:
    """Replace `folder/manifest.json` atomically (temporary file, fsync, rename)."""
    path = manifest_path(folder)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest.to_json(), f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(folder: str | Path) -> Manifest:
    """Load `folder/manifest.json` (or the manifest file itself).

    Raises:
        ZebraError: missing, not JSON, not a zebra data manifest, or a field missing or of the wrong type.
    """
    path = Path(folder)
    if path.is_dir():
        path = manifest_path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ZebraError(f"{path}: missing", fix="pass a folder made by `zebra data prep`") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ZebraError(
            f"{path}: not valid JSON ({e})", fix="delete the folder and prepare it again"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ZebraError(f"{path}: not a zebra data manifest", fix="pass a folder made by `zebra data prep`")
    version = data.get("format_version", 0)
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise ZebraError(f"{path}: made by a newer zebra (format {version})", fix="upgrade zebra")
    manifest = _typed(Manifest, data, path, "manifest")
    manifest.shards = [_typed(Shard, s, path, f"shards[{i}]") for i, s in enumerate(manifest.shards)]
    for i, shard in enumerate(manifest.shards):
        if shard.prefix in ("", ".", "..") or Path(shard.prefix).name != shard.prefix:
            raise _malformed(path, f"shards[{i}].prefix {shard.prefix!r} is not a file name in the folder")
    return manifest


_TYPES = {"str": str, "int": int, "bool": bool, "dict": dict, "list": list}


def _typed(cls: type, data: Any, path: Path, where: str) -> Any:
    """`cls(**data)` for a dataclass, once every field is there with the type its annotation names (keys it
    does not know, like `totals`, are left out).

    Raises:
        ZebraError: `data` is not an object, or a field is missing or of another type.
    """
    if not isinstance(data, dict):
        raise _malformed(path, f"{where} is not an object")
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise _malformed(path, f"{where} has no {f.name!r}")
            continue
        value = kwargs[f.name] = data[f.name]
        if not _is(value, f.type.split("[")[0]) or (
            f.type == "dict[str, int]" and not all(_is(v, "int") for v in value.values())
        ):
            raise _malformed(path, f"{where}.{f.name} is {repr(value)[:60]}, expected {f.type}")
    return cls(**kwargs)


def _is(value: Any, type_name: str) -> bool:
    """`isinstance` for the annotation `type_name` (str, int, bool, dict, list); a bool is no int here."""
    return isinstance(value, _TYPES[type_name]) and (type_name == "bool" or not isinstance(value, bool))


def _malformed(path: Path, detail: str) -> ZebraError:
    return ZebraError(
        f"{path}: not a valid zebra data manifest ({detail})",
        fix="restore manifest.json, or delete the folder and prepare it again",
    )


def shard_paths(folder: str | Path, manifest: Manifest) -> list[Path]:
    """Absolute prefixes of the committed shards, in order."""
    return [Path(folder).resolve() / s.prefix for s in manifest.shards]
