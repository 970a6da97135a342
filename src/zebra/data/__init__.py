"""Data: sources, tokenizers and Megatron shards. The trainer's entry points are re-exported here.

- `resolve_prefixes(path)` -> `[(prefix, weight), ...]` for one recipe data path (`@sample`, a data folder,
  or a plain Megatron prefix, each optionally `:WEIGHT`).
- `sample_prefix(tokenizer)` -> the bundled sample corpus tokenized (cached), as a Megatron prefix.
- `load_tokenizer(name_or_path)` -> a `PreTrainedTokenizerFast` (`byte` is built in).
"""

from zebra.data.manifest import read_manifest, resolve_prefixes
from zebra.data.sample import sample_prefix
from zebra.data.tokenizers import load_tokenizer

__all__ = ["load_tokenizer", "read_manifest", "resolve_prefixes", "sample_prefix"]
