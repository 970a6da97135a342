"""The decoding engine `zebra chat` and `zebra generate` load: `load_engine` with its notes (a run folder's
export written first) on stderr."""

from __future__ import annotations

from typing import Any

from zebra.cli._output import out


def load_cli_engine(model: str, **options: Any) -> tuple[Any, Any]:
    """(engine, tokenizer) of `zebra.generation.loading.load_engine(model, **options)`, its notes told."""
    from zebra.generation.loading import load_engine

    return load_engine(model, on_note=out.note, **options)
