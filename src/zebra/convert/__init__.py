"""Checkpoint conversion: Zebra HF exports, FLA (GDN / KDA) and Primus-Megatron (torch / torch_dist) formats.

Public API (imported lazily, so `import zebra.convert` stays light):
    export_hf(tensors, model, output, ...)   write a Zebra HF export (used by the trainer and `zebra convert`)
    export_run(run_dir, output=None, ...)     export a training run's latest checkpoint
    convert(src, to="hf", output=None, ...)   any supported source -> Zebra HF export or FLA directory
    open_checkpoint(src, fmt="auto")         any supported source as (ZebraConfig, lazy tensors, info)
    detect_format(src)                        which format a path holds
    verify(directory, against=None, ...)      key/shape audit + logits parity + greedy sample
"""

from __future__ import annotations

from zebra.core.lazy import lazy_exports

_EXPORTS = {
    "export_hf": "zebra.convert.hf_export",
    "export_run": "zebra.convert.pipeline",
    "convert": "zebra.convert.pipeline",
    "open_checkpoint": "zebra.convert.formats",
    "detect_format": "zebra.convert.formats",
    "verify": "zebra.convert.verifier",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
