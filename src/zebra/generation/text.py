"""Text on top of the token engine: token ids in, printable text out, one piece per token as it arrives.

The engine knows nothing about text; this module is where generation meets a tokenizer. `TextStream` turns
tokens into text pieces (chat uses it per turn); `stream_completion` continues one prompt (`zebra generate`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from zebra.errors import ZebraError
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
) -> Iterator[str]:
    """Continue `prompt` and yield the new text as it is generated, up to the tokenizer's eos (not shown) or
    `max_new_tokens` tokens.

    Raises:
        ZebraError: the prompt has no tokens.
    """
    ids = tokenizer(prompt)["input_ids"]
    if not ids:
        raise ZebraError("the prompt is empty after tokenization", fix="pass a non-empty --prompt or --file")
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
