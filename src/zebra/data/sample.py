"""The bundled sample corpus as training data: `@sample` in a recipe's `data.paths`.

`sample_prefix(tokenizer)` tokenizes `sample_corpus.jsonl.gz` (see `zebra.data.sample_corpus`) on first use
into the cache folder (`$ZEBRA_CACHE`, default `~/.cache/zebra`) and returns the Megatron prefix. Concurrent
callers (e.g. several training ranks) wait on a file lock, so the corpus is tokenized once.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from zebra.data.sample_corpus import CORPUS_PATH


def cache_dir() -> Path:
    """`$ZEBRA_CACHE`, or `~/.cache/zebra`."""
    return Path(os.environ.get("ZEBRA_CACHE") or Path.home() / ".cache" / "zebra").expanduser()


def sample_prefix(tokenizer: str = "byte") -> Path:
    """The Megatron prefix of the sample corpus tokenized with `tokenizer` (prepared on first use).

    Args:
        tokenizer: `byte` or any HF tokenizer name or path.

    Returns:
        Path such that `PREFIX.bin` / `PREFIX.idx` exist (one shard, EOD after every document).
    """
    from zebra.data import tokenizers as tok
    from zebra.data.manifest import manifest_path, read_manifest
    from zebra.data.prep import plan_prep, run_prep
    from zebra.data.sources import open_source

    loaded = tok.load_tokenizer(tokenizer)
    slug = tokenizer.strip("/").replace("/", "--").replace(".", "_") or "tokenizer"
    folder = cache_dir() / "sample" / f"{slug}-{tok.vocab_hash(loaded)[:12]}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (manifest_path(folder).exists() and read_manifest(folder).complete):
            # zebra's own cache: a partial or stale copy is simply redone (seconds)
            plan = plan_prep(
                open_source(str(CORPUS_PATH)), folder, tokenizer=tokenizer, workers=1, force=True
            )
            run_prep(plan)
        manifest = read_manifest(folder)
    return folder / manifest.shards[0].prefix
