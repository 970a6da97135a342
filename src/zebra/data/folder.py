"""A data folder being written, shard by shard: the resume rules shared by `prep` and `convert-fla`.

The folder holds `NAME_00000.bin/.idx`, ... (NAME = the folder's name) and `manifest.json`. Source rows
`[i * R, (i + 1) * R)` always become shard `i`. A shard is written under temporary names, renamed when
complete, then recorded in the manifest (rewritten atomically); a re-run keeps every recorded shard whose
files still match and regenerates the rest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zebra.core.errors import ZebraError
from zebra.core.locks import FolderLock
from zebra.data.indexed import ShardWriter, check_prefix
from zebra.data.manifest import Manifest, Shard, manifest_path, read_manifest, write_manifest

_FIX = "choose another --output, or pass --force to replace its contents"


def folder_lock(path: Path) -> FolderLock:
    """The lock of a data folder being written (`FOLDER/.lock`); not yet taken."""
    return FolderLock(path, fix="wait for it to end, or choose another --output")


def shard_prefix(folder: Path, index: int) -> Path:
    """The Megatron prefix of shard `index` of `folder`: `FOLDER/NAME_0000i` (NAME = the folder's name)."""
    return folder / f"{folder.name}_{index:05d}"


@dataclass
class FolderResult:
    """What one run left in a data folder (`run_prep`; `convert_fla` adds its verification)."""

    manifest: Manifest
    folder: Path
    shards_written: int
    shards_kept: int
    seconds: float
    notes: list[str]  # shards dropped and regenerated, encoders left aside, ...


class ShardFolder:
    """Write a data folder: `with ShardFolder(path, manifest, force=...) as shards:`.

    Entering creates the folder (first removing zebra's files there, with `force`), keeps the recorded shards
    whose files still match the manifest (`notes` says which were dropped) and writes the manifest;
    `manifest.rows` is then the source row to resume from. `open_shard(i)` starts shard `i`, `commit` publishes
    and records it. Leaving discards a shard still open and removes temporary files a killed run left behind.

    Args:
        path: the folder (absolute).
        manifest: from `resume_manifest`: the shards of a matching earlier run, if any.
        force: start over, whatever the folder holds.
        notes: the list the folder's notes are added to (default: a new one).
    """

    def __init__(
        self, path: Path, manifest: Manifest, *, force: bool = False, notes: list[str] | None = None
    ) -> None:
        self.path, self.manifest, self.force = path, manifest, force
        self.writer: ShardWriter | None = None  # the open shard
        self.notes = [] if notes is None else notes
        self.kept = self.written = 0
        self.start = time.monotonic()

    def __enter__(self) -> ShardFolder:
        self.lock = folder_lock(self.path).acquire()
        try:
            if self.force:
                _clear(self.path)
            self.notes += _verify_committed(self.path, self.manifest)
            self.kept = len(self.manifest.shards)
            write_manifest(self.path, self.manifest)
        except BaseException:
            self.lock.release()  # __exit__ does not run when __enter__ fails: a long-lived process keeps no lock
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.writer is not None:
            self.writer.discard()
            self.writer = None
        for path in self.path.glob(f"{self.path.name}_*.tmp.*"):
            path.unlink(missing_ok=True)
        self.lock.release()

    def open_shard(self, index: int) -> ShardWriter:
        """Start shard `index` (its tokens in the manifest's dtype), under temporary names until `commit`."""
        assert self.writer is None, "commit the open shard first"
        self.writer = ShardWriter(shard_prefix(self.path, index), self.manifest.dtype)
        return self.writer

    def commit(self, *, complete: bool, **stats: Any) -> Shard:
        """Finish and rename the open shard, then record it in the manifest (atomic rewrite).

        Args:
            complete: this was the last shard; the manifest says the folder is complete.
            stats: first_row, rows, bytes, skipped (and encoders): the source rows the shard covers.
        """
        writer, self.writer = self.writer, None
        files = writer.finish()
        writer.commit()
        shard = Shard(
            prefix=Path(writer.prefix).name,
            documents=writer.documents,
            tokens=writer.tokens,
            **stats,
            **files,
        )
        self.manifest.shards.append(shard)
        self.manifest.complete = complete
        write_manifest(self.path, self.manifest)
        self.written += 1
        return shard

    def mark_complete(self) -> None:
        """Record that no rows are left (when the last shard was committed before the source said so)."""
        self.manifest.complete = True
        write_manifest(self.path, self.manifest)

    def result(self) -> FolderResult:
        return FolderResult(
            self.manifest, self.path, self.written, self.kept, time.monotonic() - self.start, self.notes
        )


def resume_manifest(folder: Path, fresh: Manifest, *, force: bool) -> Manifest:
    """`fresh`, carrying over the shards of a matching earlier run in `folder` (read only; nothing is written).

    Raises:
        ZebraError: the folder holds another tokenizer's data, or data made with other settings.
    """
    if force or not manifest_path(folder).exists():
        return fresh  # with force, ShardFolder clears the folder when it starts writing
    old = read_manifest(folder)
    if old.tokenizer.get("vocab_hash") != fresh.tokenizer.get("vocab_hash"):
        raise ZebraError(
            f"{folder} holds data tokenized with {old.tokenizer.get('name')} "
            f"(vocab hash {str(old.tokenizer.get('vocab_hash'))[:12]}), not "
            f"{fresh.tokenizer.get('name') or 'without a tokenizer (none given)'}",
            fix=_FIX,
        )
    changed = _changed_files(old.source, fresh.source)
    if changed:
        raise ZebraError(
            f"{folder}: {changed}",
            fix="restore the source files, pass --force to start over, or choose another --output",
        )
    different = [k for k in ("source", "dtype", "config") if getattr(old, k) != getattr(fresh, k)]
    if different:
        detail = ", ".join(f"{k}: {_diff(getattr(old, k), getattr(fresh, k))}" for k in different)
        raise ZebraError(f"{folder} holds data prepared with other settings ({detail})", fix=_FIX)
    fresh.shards, fresh.complete = old.shards, old.complete
    return fresh


def _changed_files(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What changed in the local source files since the manifest `old` was written (None: nothing, or a
    source of another kind or other files, which the settings check reports)."""
    if not (old.get("kind") == new.get("kind") == "local" and old.get("files") == new.get("files")):
        return None
    before = old.get("fingerprints")
    if before is None:
        return "an older zebra started this folder without recording its source files, so a resume cannot check them"
    for path, was, now in zip(new["files"], before, new["fingerprints"], strict=True):
        if was != now:
            how = (
                f"{was['bytes']:,} bytes, now {now['bytes']:,}"
                if was["bytes"] != now["bytes"]
                else "the same size, other content in its first or last MiB"
            )
            return (
                f"{path} changed since this folder was started ({how}); resuming would mix two versions of it"
            )
    return None


def _diff(old: Any, new: Any) -> str:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return "; ".join(f"{k} was {_short(old.get(k))}, now {_short(new.get(k))}" for k in keys)
    return f"was {_short(old)}, now {_short(new)}"


def _short(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters (a source's file fingerprints would fill the terminal)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clear(folder: Path) -> None:
    """Remove only what zebra wrote there: its shards, temporary files and the manifest."""
    for path in folder.glob(f"{folder.name}_*"):
        if path.suffix in (".bin", ".idx"):
            path.unlink()
    manifest_path(folder).unlink(missing_ok=True)


def _verify_committed(folder: Path, manifest: Manifest) -> list[str]:
    """Keep the recorded shards whose files match the manifest; drop the first bad one and all after it.

    Returns:
        One note per dropped run of shards (the writer regenerates them).
    """
    for i, shard in enumerate(manifest.shards):
        prefix = folder / shard.prefix
        try:
            info = check_prefix(prefix)
            problem = None
            if (info.tokens, info.documents) != (shard.tokens, shard.documents):
                problem = (
                    f"holds {info.documents} documents / {info.tokens} tokens, manifest.json says otherwise"
                )
            elif (_size(prefix, "bin"), _size(prefix, "idx")) != (shard.bin_bytes, shard.idx_bytes):
                problem = "file sizes differ from manifest.json"
        except ZebraError as e:
            problem = e.message
        if problem:
            dropped = len(manifest.shards) - i
            manifest.shards = manifest.shards[:i]
            manifest.complete = False
            return [f"shard {shard.prefix}: {problem}; regenerating it ({dropped} shard(s) from there on)"]
    return []


def _size(prefix: Path, ext: str) -> int:
    return Path(f"{prefix}.{ext}").stat().st_size
