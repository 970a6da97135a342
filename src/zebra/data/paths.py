"""Recipe data paths: the grammar of one `data.paths` entry, `TARGET[:WEIGHT]`, and what a TARGET names.

A TARGET is `@sample` (the bundled corpus), a data folder made by `zebra data prep` / `convert-fla` (or its
`manifest.json`), or a plain Megatron prefix `PATH/NAME` (`NAME.bin` + `NAME.idx`). The recipe loader, the
trainer, `resolve_prefixes` (`zebra.data.prefixes`) and `zebra data inspect` all read entries through
`parse_data_path` and `prep_folder`. This module reads no data, so validating a recipe stays cheap.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from zebra.core.errors import ZebraError
from zebra.data.manifest import MANIFEST, manifest_path

BUNDLED = "@sample"  # the TARGET naming the bundled corpus
_EXPECTED = "expected PREFIX[:weight]"


class DataPath(NamedTuple):
    """One parsed `data.paths` entry."""

    target: str  # `@sample`, a data folder, its manifest.json, or a Megatron prefix
    weight: float  # > 0; relative to the other entries' weights


def parse_data_path(entry: str) -> DataPath:
    """Split `TARGET[:WEIGHT]` (the weight defaults to 1.0).

    The part after the last ':' is the weight unless it holds a '/', so `/mnt/a:b/x` is a path without weight.
    A TARGET whose last part holds a ':' therefore needs an explicit weight: `data/v1:2:1.0`.

    Raises:
        ZebraError: an empty TARGET, or a WEIGHT that is not a finite number above 0.
    """
    head, sep, tail = entry.rpartition(":")
    target, weight_text = (head, tail) if sep and "/" not in tail else (entry, None)
    if not target:
        raise ZebraError(f"{entry!r}: empty prefix ({_EXPECTED})", fix="write the data path before the ':'")
    if weight_text is None:
        return DataPath(target, 1.0)
    try:
        weight = float(weight_text)
    except ValueError:
        weight = math.nan
    if not (math.isfinite(weight) and weight > 0):
        raise ZebraError(
            f"{entry!r}: weight {weight_text!r} is not a positive number ({_EXPECTED})",
            fix="write PATH, or PATH:WEIGHT with a WEIGHT above 0",
        )
    return DataPath(target, weight)


def prep_folder(target: str | Path) -> Path | None:
    """The data folder a TARGET names (the folder itself, or its manifest.json), or None when it names none."""
    path = Path(target).expanduser()
    folder = path.parent if path.name == MANIFEST else path
    return folder if folder.is_dir() and manifest_path(folder).is_file() else None
