"""The tokenizer and chat template inside a GGUF, as llama.cpp's byte-level BPE (`tokenizer.ggml.model: gpt2`).

A Hugging Face byte-level BPE tokenizer (`tokenizer.json` model `BPE` over GPT-2's byte -> character table) maps to
llama.cpp's `gpt2` model token for token: the vocabulary strings, the merges in rank order, the special tokens
as CONTROL tokens, and a pre-tokenizer llama.cpp names (`tokenizer.ggml.pre`). Zebra's built-in `byte`
tokenizer is such a BPE with no merges, one token per byte (ids 0..255 the bytes): with no merges the
pre-tokenizer's split cannot change a token, so `default` is exact. With merges, the split decides the tokens,
and only pre-tokenizers matched exactly to llama.cpp's are written (`PRE_TOKENIZERS`); others are refused.
Ids past the tokenizer, up to the embedding's padded row count, are UNUSED `[PADn]` tokens.
"""

from __future__ import annotations

import json
from typing import Any

from zebra.core.errors import ZebraError

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
# a tokenizer.json pre-tokenizer (its Split regex, or "bytelevel" for GPT-2's built-in one) -> llama.cpp's name
PRE_TOKENIZERS = {LLAMA3_SPLIT: "llama-bpe", "bytelevel": "gpt-2"}
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # llama.cpp's token types (gguf.TokenType)


def _pre_tokenizer(spec: dict[str, Any] | None) -> str | None:
    """The regex a tokenizer.json `pre_tokenizer` splits with ("bytelevel" for ByteLevel's own), or None."""
    if spec is None:
        return None
    if spec.get("type") == "Sequence":
        found = [_pre_tokenizer(s) for s in spec.get("pretokenizers", [])]
        return next((f for f in found if f is not None), None)
    if spec.get("type") == "Split":
        return spec.get("pattern", {}).get("Regex")
    if spec.get("type") == "ByteLevel" and spec.get("use_regex", True):
        return "bytelevel"
    return None


def vocab_fields(tok: Any, vocab_size: int) -> dict[str, Any]:
    """`tokens`, `types`, `merges`, `pre` of llama.cpp's `gpt2` model for the HF tokenizer `tok`.

    Raises:
        ZebraError: the tokenizer is not a byte-level BPE, its pre-tokenizer has no exact llama.cpp name, or it
            holds more ids than the model's embedding.
    """
    spec = json.loads(tok.backend_tokenizer.to_str())
    model = spec.get("model", {})
    name = getattr(tok, "name_or_path", "the tokenizer")
    if model.get("type") != "BPE" or (spec.get("decoder") or {}).get("type") != "ByteLevel":
        raise ZebraError(
            f"--to gguf: tokenizer {name} is not a byte-level BPE, the one kind written to GGUF here",
            fix="export with --tokenizer byte or a byte-level BPE tokenizer (GPT-2 / Llama-3 style)",
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    split = _pre_tokenizer(spec.get("pre_tokenizer"))
    pre = "default" if not merges else PRE_TOKENIZERS.get(split or "")
    if pre is None:
        raise ZebraError(
            f"--to gguf: tokenizer {name} splits text with a pre-tokenizer llama.cpp has no exact name for "
            f"({split!r}), so llama.cpp would tokenize differently",
            fix="use a Llama-3 or GPT-2 style tokenizer, or --tokenizer byte",
        )
    tokens: dict[int, tuple[str, int]] = {i: (t, NORMAL) for t, i in model["vocab"].items()}
    for i, added in tok.added_tokens_decoder.items():
        tokens[i] = (added.content, CONTROL if added.special else USER_DEFINED)
    if max(tokens) >= vocab_size:
        raise ZebraError(
            f"--to gguf: tokenizer {name} has ids up to {max(tokens)}, past the model's {vocab_size} embedding rows",
            fix="pass the tokenizer the model was trained with (--tokenizer)",
        )
    rows = [tokens.get(i, (f"[PAD{i}]", UNUSED)) for i in range(vocab_size)]
    return {"tokens": [t for t, _ in rows], "types": [k for _, k in rows], "merges": merges, "pre": pre}


def write_vocab(writer: Any, tok: Any, vocab_size: int, ids: dict[str, int | None]) -> None:
    """Add the tokenizer, its special ids and chat template (`tok.chat_template`) to `writer` (a GGUFWriter)."""
    from gguf import GGUFValueType

    fields = vocab_fields(tok, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(fields["pre"])
    writer.add_token_list(fields["tokens"])
    writer.add_token_types(fields["types"])
    # present even when empty (llama.cpp needs the key): gguf-py's add_array would skip an empty list
    writer.add_key_value("tokenizer.ggml.merges", fields["merges"], GGUFValueType.ARRAY, GGUFValueType.STRING)
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):  # fmt: skip
        if ids.get(key) is not None:
            add(ids[key])
    encoded = tok("a", add_special_tokens=True)["input_ids"]
    writer.add_add_bos_token(tok.bos_token_id is not None and encoded[:1] == [tok.bos_token_id])
    writer.add_add_eos_token(tok.eos_token_id is not None and encoded[-1:] == [tok.eos_token_id])
    if getattr(tok, "chat_template", None):
        writer.add_chat_template(tok.chat_template)
