"""The upcycle report: where every student tensor came from, the KV cache against the teacher's, the parameters.

Written as `upcycle.json` into the export folder; `zebra upcycle` prints the same as a Rich table.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# How a student tensor was made.
COPIED = "copied"  # a teacher tensor, unchanged (bit-equal in the teacher's dtype)
SVD = "svd"  # a factor of a truncated SVD of teacher tensors
REPEATED = "repeated"  # a teacher tensor with its KV heads repeated to every query head of their group
MEAN = "mean"  # the mean over KV heads of teacher rows (MLA's shared RoPE key)
ASSEMBLED = "assembled"  # row blocks of different origins (Mamba2's in_proj)
INITIALISED = "initialised"  # the mixer's own initialisation (not from the teacher)
FITTED = "fitted"  # made as above, then fitted to the teacher attention's output (`--calibrate`)


@dataclass
class TensorOrigin:
    """One student tensor: `how` it was made (the constants above), from which teacher tensors, and details."""

    name: str
    shape: list[int]
    how: str
    source: str = ""  # teacher tensor names, comma-separated
    detail: str = ""  # rank and energy, repeat factor, row blocks
    rank: int | None = None  # SVD: the rank kept
    energy: float | None = None  # SVD: the share of the squared singular values kept (0..1)


@dataclass
class UpcycleReport:
    """What `zebra upcycle` made (`to_dict` is upcycle.json); `read` loads one back."""

    teacher: str
    teacher_format: str
    output: str
    mixer: str
    pattern: str
    mla_layers: list[int]
    dtype: str
    teacher_params: int
    student_params: int
    kv_cache_fraction: float  # per-token KV cache of the student / the teacher's (MLA latents vs K and V)
    tensors: list[TensorOrigin] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # `zebra upcycle --compose`: the two students ({"mla": folder, "recurrent": folder}), the folder each dense
    # layer (mixer + MLP) came from, how the MLA layers were placed (even / explicit / smart) and SMART's scores
    students: dict[str, str] = field(default_factory=dict)
    layer_sources: list[str] = field(default_factory=list)
    placement: str = ""
    smart: dict[str, Any] = field(default_factory=dict)
    # how the MLA factors were made: {"method": "plain"}, or "activation" with the calibration data and tokens
    svd: dict[str, Any] = field(default_factory=dict)
    # `--calibrate`: the data, the fit's settings and, per mixer layer, its relative output error as upcycled, after
    # the gate init and after the fit (`zebra.upcycle.calibrate.Calibrated.record`); empty without it
    calibration: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Tensors per kind of origin."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.how] = out.get(t.how, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "counts": self.counts()}

    @classmethod
    def read(cls, path: Path) -> UpcycleReport:
        """An upcycle.json back as a report (keys it does not know, e.g. `counts`, are dropped)."""
        data = json.loads(path.read_text())
        known = {f.name for f in fields(cls)}
        report = cls(**{k: v for k, v in data.items() if k in known})
        report.tensors = [TensorOrigin(**t) for t in data.get("tensors", [])]
        return report

    def write(self, path: Path) -> None:
        """Write JSON to a temporary name, then rename it into place."""
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)
