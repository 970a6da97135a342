"""The layer class of a mixer, imported from its dotted path (`zebra.mixers.MixerSpec.layer`) on first use.

The HF export writes its own version of this file (`zebra.models.remote_code`): without zebra installed, the
dotted paths cannot be imported, so there the built-in layer classes are imported statically from their flat files
(which is also how transformers learns which files the export needs).
"""

from __future__ import annotations

import importlib


def layer_class(path: str) -> type:
    """The class at dotted `path`, e.g. "zebra.models.layers.mamba2.Mamba2"."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"mixer layer class {path!r} cannot be imported: {error}") from error
