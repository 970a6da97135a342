"""`manifest.json`: what a prepared data folder holds, and how the trainer finds its shards.

A data folder made by `zebra data prep` (or `convert-fla`) holds `NAME_00000.bin/.idx`, ... and a
`manifest.json` listing every committed shard with its source rows, document and token counts and sha256
checksums, plus the source, tokenizer (name and vocabulary hash), dtype and zebra version. The manifest is
rewritten atomically after each shard is committed, so it always describes exactly the shards on disk.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zebra.errors import ZebraError

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
        ZebraError: missing, not JSON, or not a zebra data manifest.
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
    if data.get("format_version", 0) > FORMAT_VERSION:
        raise ZebraError(
            f"{path}: made by a newer zebra (format {data['format_version']})", fix="upgrade zebra"
        )
    data.pop("totals", None)
    shards = [Shard(**s) for s in data.pop("shards", [])]
    return Manifest(**data, shards=shards)


def shard_paths(folder: str | Path, manifest: Manifest) -> list[Path]:
    """Absolute prefixes of the committed shards, in order."""
    return [Path(folder).resolve() / s.prefix for s in manifest.shards]
