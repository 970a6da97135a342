"""Token ids in, printable text out, one piece per token as it arrives."""

from __future__ import annotations

from typing import Any

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
