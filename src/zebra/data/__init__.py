"""Data: sources, tokenizers and Megatron shards. The trainer's entry points are re-exported here.

- `parse_data_path(entry)` -> the `DataPath` (`target`, `weight`) of one recipe data path `TARGET[:WEIGHT]`; the
  recipe loader calls it once per entry, and a recipe holds `DataPath`s from there on.
- `resolve_prefixes(path)` -> `[DataPath(prefix, weight), ...]` for one recipe data path (`@sample`, a data
  folder, or a plain Megatron prefix): the way from a recipe's data path into the data pipeline.
- `bundled_prefix(tokenizer)` -> the bundled corpus (`@sample`) tokenized (cached), as a Megatron prefix.
- `load_tokenizer(name_or_path)` -> a `PreTrainedTokenizerFast` (`byte` is built in).
- `read_manifest(folder)` -> what a data folder holds.

Each is imported from its module on first use, so importing one light module (the recipe loader imports
`zebra.data.paths`) does not load the whole data pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zebra.core.lazy import lazy_exports

if TYPE_CHECKING:
    from zebra.data.manifest import read_manifest
    from zebra.data.paths import parse_data_path
    from zebra.data.prefixes import bundled_prefix, resolve_prefixes
    from zebra.data.tokenizers import load_tokenizer

_ENTRY_POINTS = {
    "bundled_prefix": "zebra.data.prefixes",
    "load_tokenizer": "zebra.data.tokenizers",
    "parse_data_path": "zebra.data.paths",
    "read_manifest": "zebra.data.manifest",
    "resolve_prefixes": "zebra.data.prefixes",
}
__all__ = ["bundled_prefix", "load_tokenizer", "parse_data_path", "read_manifest", "resolve_prefixes"]
__getattr__ = lazy_exports(__name__, _ENTRY_POINTS)
