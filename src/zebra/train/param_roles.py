"""Which parameters of an upcycled student are its new mixers and which were copied from the teacher.

An upcycled student (`zebra upcycle`) is the teacher with each attention replaced by a new mixer (MLA from an SVD,
a recurrent mixer assembled from q/k/v/o and its own gates); its MLPs, norms, embeddings and head are the
teacher's, copied. Distillation can treat the two apart (Taylor-Calibrate: the mixers at 1e-4, the rest at 7e-6;
the mixers alone first): `distill.copied_lr_scale`, `distill.mixer_only_steps`, `distill.ild_params: mixers`.

The new mixers are read from the `train.init` export's upcycle.json, never guessed from names: a mixer sublayer
(`model.layers.{i}.mixer.*`, `i` a sublayer index) is new when any of its tensors was not copied unchanged
(`how` other than `copied`). A composed hybrid (`zebra upcycle --compose`) records every tensor as copied from
one of its two students (`source` "STUDENT_FOLDER: name"); the tensor's origin is then looked up in that
student's upcycle.json. Everything else (the mixers' pre-norms included) counts as copied.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    from zebra.recipes import Recipe
    from zebra.upcycle.report import TensorOrigin, UpcycleReport

MIXER = "mixer"  # the new mixers' parameter group
COPIED = "copied"  # everything copied from the teacher
MIXER_PARAM = re.compile(r"(?:^|\.)layers\.(\d+)\.mixer\.")  # any wrapper prefix (DDP's module., FSDP's)


def needs_roles(recipe: Recipe) -> bool:
    """Whether the run treats new mixers and copied weights apart."""
    d = recipe.distill
    mixers_only = d.stage == "ild" and d.ild_params == "mixers"
    return bool(d.teacher) and (d.copied_lr_scale != 1.0 or d.mixer_only_steps > 0 or mixers_only)


def new_mixer_sublayers(init: str | Path) -> frozenset[int]:
    """The sublayer indices whose mixer is new, from `init`/upcycle.json (a ZebraError without one)."""
    from zebra.upcycle.report import UpcycleReport

    path = Path(init) / "upcycle.json" if init else None
    if path is None or not path.is_file():
        raise ZebraError(
            f"train.init {init or '(none)'}: no upcycle.json, so the new mixers are not known "
            "(distill.copied_lr_scale, distill.mixer_only_steps and distill.ild_params=mixers need them)",
            fix="--init an export made by `zebra upcycle` (or a run's export of one), or leave those keys at "
            "their defaults",
        )
    report = UpcycleReport.read(path)
    students: dict[str, UpcycleReport] = {}
    new = set()
    for tensor in report.tensors:
        found = MIXER_PARAM.search(tensor.name)
        if found is not None and _origin(tensor, report, students) != "copied":
            new.add(int(found.group(1)))
    return frozenset(new)


def _origin(tensor: TensorOrigin, report: UpcycleReport, students: dict[str, UpcycleReport]) -> str:
    """How `tensor` was first made: its own `how`, or, in a composed hybrid, the student's record of it."""
    from zebra.upcycle.report import UpcycleReport

    folder = next((f for f in report.students.values() if tensor.source.startswith(f"{f}: ")), None)
    if folder is None:
        return tensor.how
    if folder not in students:
        path = Path(folder) / "upcycle.json"
        if not path.is_file():
            raise ZebraError(
                f"{report.output}/upcycle.json: its student {folder} is gone, so which mixers are new is unknown",
                fix="keep the students `zebra upcycle --compose` read, or leave distill.copied_lr_scale, "
                "mixer_only_steps and ild_params at their defaults",
            )
        students[folder] = UpcycleReport.read(path)
    origins = {t.name: t for t in students[folder].tensors}
    return _origin(origins[tensor.name], students[folder], students) if tensor.name in origins else tensor.how


def role(name: str, mixers: frozenset[int]) -> str:
    """`MIXER` for a parameter of a new mixer, else `COPIED`."""
    found = MIXER_PARAM.search(name)
    return MIXER if found is not None and int(found.group(1)) in mixers else COPIED
