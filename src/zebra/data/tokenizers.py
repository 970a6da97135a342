"""Tokenizers: any Hugging Face tokenizer by name or path, and the built-in byte tokenizer.

The byte tokenizer is a real `transformers.PreTrainedTokenizerFast` built offline from the `tokenizers`
library: ids 0..255 are the raw UTF-8 bytes, 256 `<|endoftext|>` (eos, the Megatron EOD), 257
`<|begin_of_text|>` (bos), 258 `<|pad|>`; 259 ids in all. `save_pretrained` writes files that
`AutoTokenizer.from_pretrained(dir)` loads anywhere, without zebra installed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from zebra.core.errors import ZebraError, first_line

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedTokenizerFast

BYTE_TOKENIZER = "byte"
BYTE_EOS, BYTE_BOS, BYTE_PAD = 256, 257, 258
BYTE_VOCAB_SIZE = 259
BYTE_SPECIALS = {"<|endoftext|>": BYTE_EOS, "<|begin_of_text|>": BYTE_BOS, "<|pad|>": BYTE_PAD}

DTYPES = ("auto", "uint16", "int32")

# What the ByteLevel pre-tokenizer splits with when `use_regex` is on (GPT-2's pattern, as `tokenizers` has it).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Llama-3's Split pattern (tiktoken's cl100k_base), as in its tokenizer.json.
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerFast:
    """Load a fast tokenizer: `byte` (built in) or any HF hub name or local directory.

    Gated hub tokenizers (e.g. meta-llama/*) authenticate through huggingface_hub's usual `HF_TOKEN`
    environment variable or login cache; the token is never printed.

    Args:
        name_or_path: `byte`, a hub id such as `meta-llama/Llama-3.2-1B`, or a directory with tokenizer files.

    Returns:
        A `PreTrainedTokenizerFast` with an end-of-document token (`eos_token_id`).
    """
    if name_or_path == BYTE_TOKENIZER:
        return byte_tokenizer()
    from transformers import AutoTokenizer, PretrainedConfig, PreTrainedTokenizerFast

    # A model folder whose config maps its classes to remote code (a Zebra export): transformers' AutoTokenizer
    # would read that config and ask, on the terminal, whether to run the code. The tokenizer needs none of it.
    kwargs = {"config": PretrainedConfig()} if _maps_remote_code(name_or_path) else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except OSError as e:
        raise _load_error(name_or_path, e) from None
    except ValueError as e:  # transformers raises ValueError for directories with unusable files
        raise ZebraError(
            f"--tokenizer {name_or_path}: cannot load a tokenizer ({first_line(e)})",
            fix="pass a directory with tokenizer.json / tokenizer_config.json, a hub id, or 'byte'",
        ) from None
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ZebraError(
            f"--tokenizer {name_or_path}: {type(tokenizer).__name__} is not a fast tokenizer",
            fix="use a tokenizer that ships tokenizer.json (a `tokenizers` fast tokenizer)",
        )
    if eod_id(tokenizer) is None:
        raise ZebraError(
            f"--tokenizer {name_or_path}: the tokenizer has no eos token to mark the end of a document",
            fix="set eos_token in its tokenizer_config.json",
        )
    return tokenizer


def _maps_remote_code(name_or_path: str) -> bool:
    """True for a local folder whose config.json names remote-code classes (`auto_map`)."""
    try:
        return "auto_map" in json.loads((Path(name_or_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False


def has_tokenizer_files(folder: str | Path) -> bool:
    """True when `folder` ships a tokenizer of its own (tokenizer.json or tokenizer_config.json)."""
    folder = Path(folder)
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


def _load_error(name: str, error: OSError) -> ZebraError:
    text = str(error)
    if Path(name).exists() or name.startswith((".", "/", "~")):
        return ZebraError(
            f"--tokenizer {name}: no tokenizer files there ({first_line(error, 160)})",
            fix="point --tokenizer at a directory holding tokenizer.json, or use a hub id or 'byte'",
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    if "gated" in text.lower() or "401" in text or "403" in text:
        return ZebraError(
            f"--tokenizer {name}: the repository is gated and access was refused",
            fix="accept its license on huggingface.co and set HF_TOKEN (or run `hf auth login`)",
        )
    return ZebraError(
        f"--tokenizer {name}: not found locally and the Hugging Face Hub is "
        + ("offline (HF_HUB_OFFLINE=1)" if offline else "unreachable or has no such repository"),
        fix="check the name and the network, pass a local tokenizer directory, or use --tokenizer byte",
    )


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """The built-in byte-level tokenizer (259 ids), built offline; see the module docstring."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    # ByteLevel maps each byte to one printable character; a merge-free BPE over those 256 characters
    # gives exactly one id per byte, with id == byte value.
    alphabet = ByteLevel.alphabet()
    byte_to_char = byte_level_chars()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BYTE_SPECIALS])
    tokenizer = _with_byte_specials(core)
    tokenizer.name_or_path = BYTE_TOKENIZER
    return tokenizer


def _with_byte_specials(core) -> PreTrainedTokenizerFast:
    """A `tokenizers.Tokenizer` holding `BYTE_SPECIALS` as a transformers tokenizer with their roles."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|endoftext|>",
        bos_token="<|begin_of_text|>",
        pad_token="<|pad|>",
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )


def byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what the ByteLevel pre-tokenizer emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def eod_id(tokenizer) -> int | None:
    """The end-of-document id appended after every document: the tokenizer's eos token."""
    return tokenizer.eos_token_id


def vocab_size(tokenizer) -> int:
    """Number of ids the tokenizer can emit, added tokens included."""
    return len(tokenizer)


def vocab_hash(tokenizer) -> str:
    """sha256 over the sorted (token, id) pairs: equal for the same vocabulary, different otherwise."""
    pairs = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()


def vocabulary(tokenizer) -> tuple[int, str]:
    """(ids, vocabulary hash): what tells two tokenizers apart, as a manifest's tokenizer record keeps it."""
    return vocab_size(tokenizer), vocab_hash(tokenizer)


def export_vocabulary(folder: Path) -> tuple[int, str] | None:
    """The `vocabulary` of a model export's own tokenizer (its tokenizer.json), or None when it has none. Read
    with `PreTrainedTokenizerFast`, not AutoTokenizer: an export's config.json names remote code."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    stat = path.stat()
    return _file_vocabulary(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.cache
def _file_vocabulary(path: str, mtime_ns: int, size: int) -> tuple[int, str]:
    """`export_vocabulary` of one tokenizer.json, kept per (path, mtime, size): `zebra train --init DIR --teacher
    T` checks the export's tokenizer against the data's and against the teacher's (about a second each)."""
    from transformers import PreTrainedTokenizerFast

    return vocabulary(PreTrainedTokenizerFast.from_pretrained(str(Path(path).parent)))


def recorded_vocabulary(record: dict) -> tuple[int, str] | None:
    """The (ids, vocabulary hash) a manifest's tokenizer record names, or None for a record without a hash."""
    return (int(record["vocab_size"]), record["vocab_hash"]) if record.get("vocab_hash") else None


def tokenizer_record(name: str, tokenizer: PreTrainedTokenizerFast, *, eod: bool = True) -> dict:
    """The manifest's `tokenizer` entry: `name` as given, `vocab_size`, `vocab_hash` and `eod_id` (None when
    the data has no EOD between documents, as in FLA's chunks)."""
    return {
        "name": name,
        "vocab_size": vocab_size(tokenizer),
        "vocab_hash": vocab_hash(tokenizer),
        "eod_id": eod_id(tokenizer) if eod else None,
    }


def token_dtype(vocab: int, requested: str = "auto") -> np.dtype:
    """The narrowest Megatron dtype that holds every id below `vocab`.

    Args:
        vocab: number of ids (see `vocab_size`).
        requested: `auto` (uint16 when vocab <= 65536, else int32), `uint16` or `int32`.

    Raises:
        ZebraError: the vocabulary does not fit the requested dtype.
    """
    import numpy as np

    if requested not in DTYPES:
        raise ZebraError(f"--dtype {requested}: unknown", fix=f"use one of {', '.join(DTYPES)}")
    if requested == "auto":
        requested = "uint16" if vocab <= 1 << 16 else "int32"
    dtype = np.dtype(requested)
    if vocab - 1 > np.iinfo(dtype).max:
        raise ZebraError(
            f"tokenizer vocabulary of {vocab} ids exceeds --dtype {requested} (max id {np.iinfo(dtype).max})",
            fix="use --dtype int32 (or auto)",
        )
    return dtype


def train_bpe(
    texts: list[str], vocab_size: int = 2048, *, split: str = "gpt2", ranked: bool = False, bos: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer offline (GPT-2 / Llama-3 style: regex split, then bytes).

    Used by `zebra bench data --train-bpe` and the tests to get a realistic subword tokenizer without the
    network. Its eos `<|endoftext|>` is the EOD.

    Args:
        texts: training corpus.
        vocab_size: target vocabulary size (>= 259: the 256 bytes and three special tokens).
        split: `gpt2` (the ByteLevel pre-tokenizer's own regex) or `llama3` (Split with Llama-3's regex, then
            ByteLevel without one), as their tokenizer.json files have it.
        ranked: write the merges the way Llama-3's tokenizer.json has them (converted from tiktoken ranks):
            every way of joining two tokens into a third is a merge, ordered by the id of the token it makes,
            and a piece that is a whole vocabulary entry is taken as it is (`ignore_merges`). The vocabulary is
            the trained one; `tokenizers` alone writes one merge per token.
        bos: add `<|begin_of_text|>` before every text, as Llama-3 does (default: no bos).
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    if split == "gpt2":
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif split == "llama3":
        pre = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise ValueError(f"split must be gpt2 or llama3, not {split!r}")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(BYTE_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    if ranked:
        model = json.loads(core.to_str())["model"]
        vocab = model["vocab"]
        merges = [
            (token[:k], token[k:])
            for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])
            for k in range(1, len(token))
            if token[:k] in vocab and token[k:] in vocab
        ]
        ranked_core = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
        ranked_core.pre_tokenizer = pre
        ranked_core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BYTE_SPECIALS])
        core = ranked_core
    core.decoder = decoders.ByteLevel()
    if bos:
        core.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", core.token_to_id("<|begin_of_text|>"))],
        )
    return _with_byte_specials(core)
