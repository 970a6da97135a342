"""The teacher's top-k logits kept on disk (`distill.logit_cache: DIR`, with `distill.top_k`): a KD run that reads
the same sequences more than once (several epochs, several stages or runs over one data set) runs the teacher
once per sequence and reads the rest back, memory-mapped.

    DIR/manifest.json        what the cache belongs to (`cache_key`): the teacher, the tokenizer's vocabulary, the
                             sequence length, k and every data prefix's file sizes and index checksum
    DIR/<shard>.keys         uint64 [rows]: a sequence's content hash (its tokens and counted labels), 0 = empty
    DIR/<shard>.indices      int32 [rows, T, k]  the teacher's k largest logits' token ids   (`TopK`)
    DIR/<shard>.values       float32 [rows, T, k] and those logits
    DIR/<shard>.lse          float32 [rows, T]    the log-sum-exp of all its logits
    DIR/<shard>.label        float32 [rows, T]    its logit of the label

A cache made for other data, another teacher, tokenizer, length or k is refused in one line before the run
starts (`open_manifest`). Rows are found by content, so a row never stands for another sequence, whatever the
order or the world size. Each process appends to shards of its own (named by rank and process id), writing a
row's data before its key; a process killed mid-row leaves a row without a key, which is never read.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.atomic import make_folder, write_atomic
from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import numpy as np
    import torch

    from zebra.recipes import Recipe
    from zebra.train.distill_loss import TopK

MANIFEST = "manifest.json"
FIELDS = ("indices", "values", "lse", "label")


def _file_facts(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"file": path.name, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def teacher_facts(spec: str) -> dict[str, Any]:
    """The teacher as the cache knows it: its spec and, for local files, each file's size and time."""
    path = Path(spec)
    if path.is_file():
        return {"spec": spec, "files": [_file_facts(path)]}
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        return {"spec": spec, "files": [_file_facts(p) for p in files]}
    return {"spec": spec}


def cache_key(recipe: Recipe) -> dict[str, Any]:
    """What a cache's rows depend on (data.paths resolved to prefixes)."""
    from zebra.data import load_tokenizer
    from zebra.data.tokenizers import vocabulary

    data = []
    for prefix, _weight in recipe.data.paths:
        bin_file, idx_file = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
        data.append({"prefix": prefix, "bin_bytes": bin_file.stat().st_size, "idx_sha256": _sha256(idx_file)})
    return {
        "teacher": teacher_facts(recipe.distill.teacher),
        "tokenizer": list(vocabulary(load_tokenizer(recipe.data.tokenizer))),
        "seq_len": recipe.data.seq_len,
        "top_k": recipe.distill.top_k,
        "data": data,
    }


def open_manifest(recipe: Recipe, *, create: bool = True) -> Path:
    """The cache folder of `distill.logit_cache`, its manifest written for a new cache (unless `create` is False:
    a dry run); a cache made for other data, teacher, tokenizer, length or k is refused in one line naming what
    differs."""
    d = recipe.distill
    if recipe.data.mock:
        raise ZebraError(
            "distill.logit_cache: mock data is random, nothing to reuse", fix="--set distill.logit_cache=''"
        )
    folder = Path(d.logit_cache).expanduser().resolve()
    key = cache_key(recipe)
    manifest = folder / MANIFEST
    if manifest.is_file():
        found = json.loads(manifest.read_text()).get("key", {})
        if found != key:
            differ = [k for k in key if found.get(k) != key[k]]
            raise ZebraError(
                f"distill.logit_cache {folder}: made for another {', '.join(differ)} than this run's",
                fix=f"pass a new folder as distill.logit_cache, or delete {folder}",
            )
        return folder
    if folder.exists() and any(folder.iterdir()):
        raise ZebraError(
            f"distill.logit_cache {folder}: a folder with files but no {MANIFEST}",
            fix="pass an empty or new folder",
        )
    if create:
        make_folder(folder)
        write_atomic(manifest, json.dumps({"key": key}, indent=2) + "\n")
    return folder


def sequence_keys(tokens: torch.Tensor, targets: torch.Tensor) -> list[int]:
    """A nonzero 64-bit hash per sequence of its tokens `[m, T]` and counted labels `[m, T]` (-100 elsewhere)."""
    import numpy as np

    both = np.concatenate([tokens.cpu().numpy().astype(np.int64), targets.cpu().numpy().astype(np.int64)], 1)
    keys = [int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little") for row in both]
    return [k or 1 for k in keys]


class _Shard:
    """One set of memory-mapped files of `rows` rows."""

    def __init__(self, folder: Path, name: str, rows: int, seq_len: int, k: int, *, create: bool):
        import numpy as np

        shapes = {"indices": (rows, seq_len, k), "values": (rows, seq_len, k), "lse": (rows, seq_len),
                  "label": (rows, seq_len)}  # fmt: skip
        dtypes = {"indices": np.int32, "values": np.float32, "lse": np.float32, "label": np.float32}
        mode = "w+" if create else "r+"
        self.arrays = {f: np.memmap(folder / f"{name}.{f}", dtypes[f], mode, shape=shapes[f]) for f in FIELDS}
        self.keys = np.memmap(folder / f"{name}.keys", np.uint64, mode, shape=(rows,))
        self.filled = int((self.keys != 0).sum()) if not create else 0

    def row(self, i: int) -> dict[str, np.ndarray]:
        return {f: self.arrays[f][i] for f in FIELDS}


class LogitCache:
    """The cache in `folder` for sequences of `seq_len` tokens and the top `k` logits, appending to shards of
    `rows` rows named after `writer` (unique per process)."""

    def __init__(self, folder: Path, seq_len: int, k: int, *, writer: str, rows: int = 4096):
        self.folder, self.seq_len, self.k, self.rows, self.writer = folder, seq_len, k, rows, writer
        self.shards: list[_Shard] = []
        self.where: dict[int, tuple[int, int]] = {}  # sequence key -> (shard, row)
        for keys_file in sorted(folder.glob("*.keys")):
            rows_in = keys_file.stat().st_size // 8
            shard = _Shard(folder, keys_file.stem, rows_in, seq_len, k, create=False)
            self._index(shard)
        self.current: _Shard | None = None
        self.hits = self.misses = 0

    def _index(self, shard: _Shard) -> None:
        number = len(self.shards)
        self.shards.append(shard)
        for row, key in enumerate(shard.keys.tolist()):
            if key:
                self.where.setdefault(int(key), (number, row))

    def lookup(self, keys: list[int]) -> TopK | None:
        """The `TopK` of `[m*T]` rows when every sequence is cached, else None."""
        import numpy as np
        import torch

        from zebra.train.distill_loss import TopK

        if any(key not in self.where for key in keys):
            self.misses += len(keys)
            return None
        self.hits += len(keys)
        rows = [self.shards[s].row(r) for s, r in (self.where[key] for key in keys)]
        stacked = {f: torch.from_numpy(np.stack([row[f] for row in rows])).flatten(0, 1) for f in FIELDS}
        return TopK(stacked["indices"], stacked["values"], stacked["lse"], stacked["label"])

    def store(self, keys: list[int], top: TopK) -> None:
        """Keep the rows of `top` (`[m*T]` rows, sequence after sequence) whose keys are not cached yet."""
        import torch

        parts = {"indices": top.indices.to(torch.int32), "values": top.values.float(), "lse": top.lse.float(),
                 "label": top.label_logit.float()}  # fmt: skip
        per_sequence = {f: t.detach().cpu().numpy() for f, t in parts.items()}
        for i, key in enumerate(keys):
            if key in self.where:
                continue
            shard = self._writable()
            row = shard.filled
            rows = slice(i * self.seq_len, (i + 1) * self.seq_len)
            for f in FIELDS:
                shard.arrays[f][row] = per_sequence[f][rows]
                shard.arrays[f].flush()
            shard.keys[row] = key  # the key last: a row without one is never read
            shard.keys.flush()
            shard.filled += 1
            self.where[key] = (self.shards.index(shard), row)

    def _writable(self) -> _Shard:
        if self.current is None or self.current.filled == self.rows:
            number = len(self.shards)
            while (self.folder / f"{self.writer}-{number:04d}.keys").exists():
                number += 1
            name = f"{self.writer}-{number:04d}"
            self.current = _Shard(self.folder, name, self.rows, self.seq_len, self.k, create=True)
            self._index(self.current)
        return self.current


def writer_name(rank: int) -> str:
    """A shard name prefix no other process writes: this rank and process."""
    return f"rank{rank}-pid{os.getpid()}"
