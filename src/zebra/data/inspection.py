"""`zebra data inspect`: what a data folder or Megatron prefix holds, checked against its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zebra.data.tokenizers as tok
from zebra.core.errors import ZebraError
from zebra.data.indexed import check_prefix, open_dataset, sha256_file
from zebra.data.manifest import read_manifest
from zebra.data.paths import BUNDLED, prep_folder
from zebra.data.prefixes import bundled_prefix


def inspect_data(
    path: str,
    *,
    tokenizer: str | None = None,
    samples: int = 1,
    sample_chars: int = 400,
    checksums: bool = False,
) -> dict[str, Any]:
    """Summarize a data folder (`manifest.json` + shards) or a plain Megatron prefix.

    Every shard is validated (header, exact sizes: a truncated `.bin`/`.idx` is an error). With a manifest,
    counts are compared with it and the tokenizer's vocabulary hash is checked against the recorded one.

    Args:
        path: data folder, its manifest.json, a Megatron PREFIX, or `@sample`.
        tokenizer: tokenizer for decoding (default: the manifest's; needed for a plain prefix to decode).
        samples: how many documents to decode (the first ones).
        sample_chars: characters of each decoded document to keep.
        checksums: also recompute every file's sha256 and compare with the manifest (reads all data).

    Returns:
        A JSON-able report: documents, tokens, shards, dtype, tokenizer check, length histogram, samples.

    Raises:
        ZebraError: missing or truncated files, counts that disagree with the manifest, bad checksums.
    """
    import numpy as np

    if path == BUNDLED:
        path = str(bundled_prefix(tokenizer or "byte").parent)  # its data folder, manifest included
    p = Path(path).expanduser()
    folder = prep_folder(p)
    manifest = read_manifest(folder) if folder is not None else None
    if manifest is not None:
        prefixes = [folder / s.prefix for s in manifest.shards]
    elif p.is_dir():
        raise ZebraError(
            f"{p}: no manifest.json in this folder", fix="pass a data folder or a Megatron PREFIX"
        )
    else:
        prefixes = [p]
    lengths, shard_rows, dtype, readable = [], [], None, []
    for i, prefix in enumerate(prefixes):
        info = check_prefix(prefix)
        if info.tokens:  # an empty shard (a prep with fewer documents than shards) has no .bin to map
            ds = open_dataset(prefix)
            dtype = np.dtype(ds.index.dtype).name
            # a copy: the dataset's memory map closes with it
            lengths.append(np.array(ds.sequence_lengths, dtype=np.int64))
            readable.append(prefix)
        shard_rows.append({"prefix": prefix.name, "documents": info.documents, "tokens": info.tokens})
        if manifest is not None:
            _compare(prefix, info, manifest.shards[i], checksums)
    all_lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    report: dict[str, Any] = {
        "path": str(folder if manifest is not None else p),
        "documents": int(all_lengths.size),
        "tokens": int(all_lengths.sum()),
        "dtype": dtype or (manifest.dtype if manifest else None),
        "shards": shard_rows,
        "lengths": _length_stats(all_lengths),
        "histogram": length_histogram(all_lengths),
    }
    if manifest is not None:
        report |= {
            "complete": manifest.complete,
            "source": manifest.source,
            "config": manifest.config,
            "skipped": manifest.skipped(),
            "manifest_tokenizer": manifest.tokenizer,
            "zebra_version": manifest.zebra_version,
        }
    name = tokenizer or (manifest.tokenizer.get("name") if manifest and manifest.tokenizer else None)
    loaded, report["tokenizer_check"] = _check_tokenizer(name, manifest)
    report["samples"] = _decode_samples(readable[0], loaded, samples, sample_chars) if readable else []
    return report


def _compare(prefix: Path, info: Any, shard: Any, checksums: bool) -> None:
    fix = "delete the shard and re-run the command that made it: committed shards are kept, bad ones remade"
    if (info.documents, info.tokens) != (shard.documents, shard.tokens):
        raise ZebraError(
            f"{prefix}: {info.documents} documents / {info.tokens} tokens, manifest.json says "
            f"{shard.documents} / {shard.tokens}",
            fix=fix,
        )
    if checksums:
        for ext in ("bin", "idx"):
            if sha256_file(f"{prefix}.{ext}") != getattr(shard, f"{ext}_sha256"):
                raise ZebraError(f"{prefix}.{ext}: sha256 differs from manifest.json", fix=fix)


def _check_tokenizer(name: str | None, manifest: Any) -> tuple[Any, dict[str, Any]]:
    """Load the tokenizer and compare its vocabulary hash with the manifest's."""
    if name is None:
        return None, {"status": "skipped", "detail": "no tokenizer recorded; pass --tokenizer to decode"}
    try:
        loaded = tok.load_tokenizer(name)
    except ZebraError as e:
        return None, {"status": "unavailable", "tokenizer": name, "detail": e.message}
    check: dict[str, Any] = {"tokenizer": name, "vocab_hash": tok.vocab_hash(loaded)}
    if manifest is None or not manifest.tokenizer:
        return loaded, check | {"status": "unchecked", "detail": "no manifest to compare with"}
    expected = manifest.tokenizer.get("vocab_hash")
    if expected is None:
        return loaded, check | {"status": "unchecked", "detail": "the manifest records no vocabulary hash"}
    ok = check["vocab_hash"] == expected
    detail = (
        "vocabulary matches the manifest"
        if ok
        else f"vocabulary differs from the manifest's ({expected[:12]}…)"
    )
    return loaded, check | {"status": "ok" if ok else "mismatch", "detail": detail}


def _decode_samples(prefix: Path, tokenizer: Any, count: int, chars: int) -> list[dict[str, Any]]:
    ds = open_dataset(prefix)
    out = []
    for i in range(min(count, len(ds))):
        ids = ds[i].tolist()
        entry: dict[str, Any] = {"document": i, "tokens": len(ids), "ids": ids[:16]}
        if tokenizer is not None:
            entry["text"] = tokenizer.decode(ids)[:chars]
        out.append(entry)
    return out


def _length_stats(lengths: Any) -> dict[str, float]:
    import numpy as np

    if lengths.size == 0:
        return {}
    q = np.percentile(lengths, [50, 90, 99])
    return {
        "min": int(lengths.min()),
        "mean": float(lengths.mean()),
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "max": int(lengths.max()),
    }


def length_histogram(lengths: Any) -> list[dict[str, int]]:
    """Document counts in power-of-two length bins: `[{"lo": 64, "hi": 127, "count": n}, ...]`."""
    import numpy as np

    if lengths.size == 0:
        return []
    bins = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)  # [D]
    counts = np.bincount(bins)
    return [
        {"lo": 1 << b, "hi": (1 << (b + 1)) - 1, "count": int(c)} for b, c in enumerate(counts.tolist()) if c
    ]
