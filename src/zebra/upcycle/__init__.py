"""Upcycling: initialise a Zebra hybrid from a pretrained dense Transformer (the Zebra-Llama recipe).

    teacher (HF folder / hub id, GGUF, dense Megatron) --open_teacher--> Teacher (HF names, read lazily)
        --plan_student--> StudentPlan (ZebraConfig kwargs: the teacher's shapes + MLA placement and ranks)
        --UpcycledSource--> the student's tensors, one sublayer at a time (copied / SVD / repeated / initialised)
        --calibrate_student--> (optional) every mixer fitted to the teacher's attention (CalibratedSource)
        --export_hf--> a Zebra HF export + upcycle.json (UpcycleReport)

Public API (imported lazily, so `import zebra.upcycle` stays light):
    upcycle(teacher, output, options, ...)   the whole pipeline; returns the UpcycleReport
    upcycle_teacher(teacher, output, ...)     the same for an opened Teacher
    open_teacher(spec)                        any supported teacher as a Teacher
    StudentOptions                            the mixer, MLA placement / ranks, or a recipe
    calibrate_student(teacher, config, source, options)   gates + per-layer fit (`--calibrate`)
    CalibrateOptions, FitOptions              its data and settings
See docs/upcycle.md.
"""

from __future__ import annotations

from zebra.core.lazy import lazy_exports

_EXPORTS = {
    "upcycle": "zebra.upcycle.run",
    "upcycle_teacher": "zebra.upcycle.run",
    "open_teacher": "zebra.upcycle.readers",
    "StudentOptions": "zebra.upcycle.student",
    "UpcycleReport": "zebra.upcycle.report",
    "calibrate_student": "zebra.upcycle.calibrate",
    "CalibrateOptions": "zebra.upcycle.calibrate",
    "FitOptions": "zebra.upcycle.fit",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
