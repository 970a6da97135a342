"""Recipe data paths: the grammar of one `data.paths` entry, `TARGET[:WEIGHT]`, and what a TARGET names.

A TARGET is `@sample` (the bundled corpus), a data folder made by `zebra data prep` / `convert-fla` (or its
`manifest.json`), or a plain Megatron prefix `PATH/NAME` (`NAME.bin` + `NAME.idx`). Text is parsed once, where it
enters (`zebra train --data`, a recipe YAML's `data.paths`), into a `DataPath`; from there the recipe, the
trainer and `resolve_prefixes` (`zebra.data.prefixes`, the one way from a path to Megatron prefixes) hand the
`DataPath` on. This module reads no data, so validating a recipe stays cheap.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from zebra.core.errors import ZebraError
from zebra.data.manifest import MANIFEST, manifest_path

BUNDLED = "@sample"  # the TARGET naming the bundled corpus
_EXPECTED = "expected PREFIX[:weight]"


class _Fields(NamedTuple):
    target: str  # `@sample`, a data folder, its manifest.json, or a Megatron prefix
    weight: float  # > 0; relative to the other entries' weights


class DataPath(_Fields):
    """One parsed `data.paths` entry: unpacks and compares as `(target, weight)`; `str()` is the entry as it was
    written (`parse_data_path`), else `TARGET:WEIGHT`, the form a run's config.yaml holds resolved prefixes in.

    >>> str(parse_data_path("@sample")), str(DataPath("/d/a_text_document", 0.5))
    ('@sample', '/d/a_text_document:0.5')
    """

    written: str  # the entry's text (an attribute, not a field: equality stays `(target, weight)`)

    def __new__(cls, target: str, weight: float = 1.0, written: str | None = None) -> DataPath:
        path = super().__new__(cls, target, weight)
        path.written = written if written is not None else f"{target}:{weight!r}"
        return path

    def __getnewargs__(self) -> tuple[str, float, str]:  # copies and pickles keep the text
        return (self.target, self.weight, self.written)

    def __str__(self) -> str:
        return self.written

    def __repr__(self) -> str:
        return f"DataPath({self.written!r})"


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
        return DataPath(target, 1.0, entry)
    try:
        weight = float(weight_text)
    except ValueError:
        weight = math.nan
    if not (math.isfinite(weight) and weight > 0):
        raise ZebraError(
            f"{entry!r}: weight {weight_text!r} is not a positive number ({_EXPECTED})",
            fix="write PATH, or PATH:WEIGHT with a WEIGHT above 0",
        )
    return DataPath(target, weight, entry)


def prep_folder(target: str | Path) -> Path | None:
    """The data folder a TARGET names (the folder itself, or its manifest.json), or None when it names none."""
    path = Path(target).expanduser()
    folder = path.parent if path.name == MANIFEST else path
    return folder if folder.is_dir() and manifest_path(folder).is_file() else None
