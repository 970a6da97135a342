"""Data paths to Megatron prefixes with blend weights: what the trainer reads for each `data.paths` entry.

`@sample` is the bundled corpus (`zebra.data.bundled_corpus`), tokenized on first use into the cache folder
(`$ZEBRA_CACHE`, default `~/.cache/zebra`); concurrent callers (e.g. several training ranks) wait on a file lock,
so the corpus is tokenized once. With `prepare=False` (a dry run) nothing is written: the answer is the prefix
it would be and its document count (one per corpus row).
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import NamedTuple

import zebra.data.tokenizers as tok
from zebra.core.caches import make_cache_folder, zebra_cache_dir
from zebra.core.errors import ZebraError
from zebra.data.bundled_corpus import CORPUS_PATH
from zebra.data.folder import shard_prefix
from zebra.data.indexed import check_prefix
from zebra.data.manifest import Manifest, manifest_path, read_manifest, shard_paths
from zebra.data.paths import BUNDLED, DataPath, parse_data_path, prep_folder
from zebra.data.prep import plan_prep, run_prep
from zebra.data.text_sources import default_folder, holds_text, open_source, prep_command


def resolve_prefixes(
    entry: DataPath | str,
    *,
    tokenizer: str = "byte",
    prepare: bool = True,
    sample: BundledSample | None = None,
) -> list[DataPath]:
    """Turn one `data.paths` entry into Megatron prefixes with blend weights: the way into `zebra.data` from a
    recipe's data path (the trainer's, `zebra data inspect`'s, calibration's).

    Args:
        entry: a `DataPath` as the recipe holds it, or its text `TARGET[:WEIGHT]` (parsed here).
        tokenizer: what `@sample` is tokenized with (other targets are already tokenized); a missing folder's
            error names the `zebra data prep` command that makes it with this tokenizer.
        prepare: tokenize `@sample` into the cache if it is not there yet; False (a dry run): write nothing and
            name the prefix it would be (`bundled_sample`).
        sample: `@sample` as the caller already asked `bundled_sample` for it (tokenizer and prepare alike).

    Returns:
        `[DataPath(prefix, weight), ...]`. The weights of one entry sum to its WEIGHT and split it in proportion to
        each shard's tokens, so a folder's shards blend exactly like one concatenated dataset. Weights of
        several entries are relative to each other (Megatron's blend semantics).

    Raises:
        ZebraError: nothing there, an unfinished prep, or a shard whose files are missing or truncated.
    """
    target, weight = entry if isinstance(entry, DataPath) else parse_data_path(entry)
    if target == BUNDLED:
        return [DataPath(str((sample or bundled_sample(tokenizer, prepare=prepare)).prefix), weight)]
    folder = prep_folder(target)
    if folder is not None:
        return _folder_prefixes(folder, read_manifest(folder), weight)
    path = Path(target).expanduser()
    if Path(f"{path}.bin").exists() or Path(f"{path}.idx").exists():
        if not check_prefix(path).tokens:
            raise ZebraError(
                f"data path {target}: {path}.bin holds no tokens", fix="pass a prefix with documents"
            )
        return [DataPath(str(path.resolve()), weight)]
    if path.exists() and holds_text(path):  # text where tokenized data belongs (a .jsonl, a folder of .txt)
        out = default_folder(str(path))
        raise ZebraError(
            f"data path {target}: not tokenized data (neither a data folder with manifest.json nor a Megatron "
            "PREFIX.bin/.idx)",
            fix=f"tokenize it first: zebra data prep --source {target} --tokenizer {tokenizer} --output {out}, "
            f"then pass --data {out}",
        )
    raise ZebraError(
        f"data path {target}: no data there (no {path}/manifest.json, no {path.name}.bin/.idx)",
        fix=f"make it with `{prep_command(target, tokenizer)}`, or pass --data with a data folder, a Megatron "
        f"PREFIX or {BUNDLED}",
    )


def _folder_prefixes(folder: Path, manifest: Manifest, weight: float) -> list[DataPath]:
    """Every shard of a finished folder whose files match the manifest, weighted by its tokens."""
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
    manifest.check_has_documents(folder)
    return [
        DataPath(str(prefix), weight * s.tokens / manifest.tokens)
        for prefix, s in zip(prefixes, manifest.shards, strict=True)
        if s.tokens  # a shard whose rows were all skipped holds no documents
    ]


def cache_dir() -> Path:
    """`$ZEBRA_CACHE`, or `~/.cache/zebra`."""
    return zebra_cache_dir()


class BundledSample(NamedTuple):
    """The bundled corpus tokenized with one tokenizer: its Megatron prefix and its document count."""

    prefix: Path  # PREFIX.bin / PREFIX.idx (one shard, EOD after every document); absent if not `prepared`
    documents: int
    prepared: bool  # whether the cache holds it (False only when asked not to prepare it)


def bundled_prefix(tokenizer: str = "byte") -> Path:
    """The Megatron prefix of the bundled corpus tokenized with `tokenizer` (prepared on first use).

    Args:
        tokenizer: `byte` or any HF tokenizer name or path.

    Returns:
        Path such that `PREFIX.bin` / `PREFIX.idx` exist (one shard, EOD after every document).
    """
    return bundled_sample(tokenizer).prefix


def bundled_sample(tokenizer: str = "byte", *, prepare: bool = True) -> BundledSample:
    """The bundled corpus tokenized with `tokenizer` in the cache: tokenized there first when `prepare` and not
    there yet; with `prepare=False` nothing is written (no folder, no lock), and a corpus not yet tokenized is
    answered by the prefix it will have and its document count, one per corpus row (no row is empty).

    Args:
        tokenizer: `byte` or any HF tokenizer name or path.
    """
    loaded = tok.load_tokenizer(tokenizer)
    slug = tokenizer.strip("/").replace("/", "--").replace(".", "_") or "tokenizer"
    folder = cache_dir() / "sample" / f"{slug}-{tok.vocab_hash(loaded)[:12]}"
    if not prepare:
        if manifest_path(folder).is_file() and (manifest := read_manifest(folder)).complete:
            return BundledSample(folder / manifest.shards[0].prefix, manifest.documents, prepared=True)
        rows = open_source(str(CORPUS_PATH)).count_rows() or 0
        return BundledSample(shard_prefix(folder, 0), rows, prepared=False)
    make_cache_folder(folder.parent)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (manifest_path(folder).exists() and read_manifest(folder).complete):
            # zebra's own cache: a partial or stale copy is simply redone (seconds)
            plan = plan_prep(
                open_source(str(CORPUS_PATH)), folder, tokenizer=tokenizer, workers=1, force=True
            )
            run_prep(plan)
        manifest = read_manifest(folder)
    return BundledSample(folder / manifest.shards[0].prefix, manifest.documents, prepared=True)
