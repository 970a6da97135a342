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


def resolve_prefixes(path: str, *, tokenizer: str = "byte") -> list[tuple[str, float]]:
    """Turn one recipe data path into Megatron prefixes with blend weights; the trainer calls this.

    Accepted forms (each optionally followed by `:WEIGHT`, default 1.0):
      - `@sample`: the bundled sample corpus, tokenized with `tokenizer` on first use (cached).
      - a folder made by `zebra data prep` / `convert-fla`, or its `manifest.json`: every shard.
      - a plain Megatron prefix `PATH/NAME` (with `NAME.bin` + `NAME.idx` beside it).

    Returns:
        `[(prefix, weight), ...]`. The weights of one entry sum to its WEIGHT and split it in proportion to
        each shard's tokens, so a folder's shards blend exactly like one concatenated dataset. Weights of
        several entries are relative to each other (Megatron's blend semantics).

    Raises:
        ZebraError: nothing there, an unfinished prep, or a shard whose files are missing or truncated.
    """
    from zebra.data.indexed import check_prefix

    target, weight = _split_weight(path)
    if target == "@sample":
        from zebra.data.sample import sample_prefix

        return [(str(sample_prefix(tokenizer)), weight)]
    p = Path(target).expanduser()
    folder = p.parent if p.name == MANIFEST else p
    if manifest_path(folder).is_file() and folder.is_dir():
        manifest = read_manifest(folder)
        if not manifest.complete:
            raise ZebraError(
                f"{folder}: data preparation did not finish ({len(manifest.shards)} shards so far)",
                fix="re-run the same `zebra data prep` command: it resumes where it stopped",
            )
        prefixes = shard_paths(folder, manifest)
        for prefix, shard in zip(prefixes, manifest.shards, strict=True):
            info = check_prefix(prefix)
            if info.tokens != shard.tokens:
                raise ZebraError(
                    f"{prefix}.idx: {info.tokens} tokens, manifest.json says {shard.tokens}",
                    fix="delete the shard and re-run `zebra data prep`: it regenerates missing shards",
                )
        total = manifest.tokens or 1
        return [
            (str(prefix), weight * s.tokens / total)
            for prefix, s in zip(prefixes, manifest.shards, strict=True)
            if s.tokens  # a shard whose rows were all skipped holds nothing to sample
        ]
    if Path(str(p) + ".bin").exists() or Path(str(p) + ".idx").exists():
        check_prefix(p)
        return [(str(p.resolve()), weight)]
    raise ZebraError(
        f"data path {target}: no manifest.json folder and no {p.name}.bin/.idx",
        fix="run `zebra data prep --output FOLDER` and use FOLDER, or give a Megatron PREFIX, or @sample",
    )


def _split_weight(path: str) -> tuple[str, float]:
    head, sep, tail = path.rpartition(":")
    if sep and head and tail and "/" not in tail:
        try:
            weight = float(tail)
        except ValueError:
            return path, 1.0
        if weight <= 0:
            raise ZebraError(
                f"data path {path}: weight must be > 0", fix="use PATH or PATH:WEIGHT with WEIGHT > 0"
            )
        return head, weight
    return path, 1.0
