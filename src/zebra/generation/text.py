"""Text on top of the token engine: token ids in, printable text out, one piece per token as it arrives.

The engine knows nothing about text; this module is where generation meets a tokenizer. `TextStream` turns
tokens into text pieces (chat uses it per turn); `stream_completion` continues one prompt (`zebra generate`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from zebra.core.errors import ZebraError
from zebra.generation.engine import Engine
from zebra.generation.token_sampling import SamplingParams

_INCOMPLETE = "\ufffd"  # what a tokenizer decodes a cut-off multi-byte UTF-8 character to


class TextStream:
    """Incremental detokenizer: `push(id)` returns the text that token completes (often '', e.g. mid-character).

    Decoding restarts after each newline so the work per token stays small; special tokens are not shown.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = ""

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith(_INCOMPLETE):
            return ""
        piece = text[len(self.shown) :]
        if text.endswith("\n"):
            self.ids, self.shown = [], ""
        else:
            self.shown = text
        return piece

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the end of the stream)."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True) if self.ids else ""
        piece = text[len(self.shown) :]
        self.ids, self.shown = [], ""
        return piece


def stream_completion(
    engine: Engine,
    tokenizer: Any,
    prompt: str,
    *,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    seed: int | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Iterator[str]:
    """Continue `prompt` and yield the new text as it is generated, up to the tokenizer's eos (not shown),
    `max_new_tokens` tokens or the model's context (`Engine.budgets`).

    `on_note` is told, before the first piece, when the prompt or `max_new_tokens` reaches past the model's context
    (`context_note`).

    Raises:
        ZebraError: the prompt has no tokens.
    """
    ids = tokenizer(prompt)["input_ids"]
    if not ids:
        raise ZebraError("the prompt is empty after tokenization", fix="pass a non-empty --prompt or --file")
    note = context_note(engine, len(ids), max_new_tokens)
    if note is not None and on_note is not None:
        on_note(note)
    stream = TextStream(tokenizer)
    stop = {tokenizer.eos_token_id} - {None}
    for tokens in engine.generate(
        [ids], max_new_tokens=max_new_tokens, sampling=sampling, stop_ids=stop, seed=seed
    ):
        token = tokens[0]
        if token is not None and token not in stop and (piece := stream.push(token)):
            yield piece
    if tail := stream.flush():
        yield tail


def context_note(engine: Engine, prompt_tokens: int, max_new_tokens: int) -> str | None:
    """What a user of `zebra generate` is told when a prompt of `prompt_tokens` tokens, or `max_new_tokens` on top
    of it (`--max-new`), reaches past the model's context (`Engine.context`); None when neither does."""
    context = engine.context
    if context is None:
        return None
    if prompt_tokens >= context:
        note = past_context_note("the prompt is", prompt_tokens, context)
        if max_new_tokens > context:
            note += f" (--max-new {max_new_tokens} is cut to {context} new tokens)"
        return note
    if prompt_tokens + max_new_tokens > context:
        return (
            f"--max-new {max_new_tokens} reaches past the model's context of {context} tokens (the prompt takes "
            f"{prompt_tokens}); generation stops there"
        )
    return None


def past_context_note(what: str, tokens: int, context: int) -> str:
    """`WHAT N tokens, past the model's context of M; ...`: told when `tokens` reach the whole `context` or more."""
    where = "past" if tokens > context else "the whole of"
    return f"{what} {tokens} tokens, {where} the model's context of {context}; quality past it is not trained"
