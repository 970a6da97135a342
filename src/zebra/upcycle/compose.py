"""`compose`: the hybrid of the published pipeline from two students of one teacher (`zebra upcycle --compose`).

The ILD stage trains two students of the same teacher: all-MLA (`zebra upcycle T --mla-layers all`) and
all-recurrent (`--mla 0`). The hybrid takes each dense layer i (sublayers 2i, 2i+1: mixer and MLP, with their
pre-norms) from the student whose mixer it uses there: the all-MLA student at the MLA layers, the all-recurrent
one elsewhere. The embeddings, the output head and the final norm come from the teacher (the base model), as in
Zebra-Llama. Where the MLA layers go: `--mla-layers`, `--mla N` placed evenly, or `--mla N --placement smart`
(`zebra.upcycle.smart`: by how much each layer lowers the KL to the teacher).

upcycle.json (`UpcycleReport`) names both students, the folder each layer came from, the placement and, for
SMART, the per-layer scores.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zebra.convert.tensor_sources import SafetensorsSource, TensorSource
from zebra.core.atomic import check_output_apart
from zebra.core.errors import ZebraError
from zebra.folders.model_folder import check_output
from zebra.mixers import ATTENTION, MLP
from zebra.upcycle.report import COPIED, TensorOrigin, UpcycleReport
from zebra.upcycle.run import REPORT_FILE
from zebra.upcycle.student import SHAPE_KEYS, check_mla_layers, mla_placement, parse_mla_layers, pattern

MLA_KEYS = ("num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim")  # fmt: skip
PLACEMENTS = ("even", "smart")


@dataclass(frozen=True)
class Student:
    """An ILD student (a Zebra export with the upcycle.json of the `zebra upcycle` it started from)."""

    folder: Path
    config: dict[str, Any]  # its config.json
    report: UpcycleReport  # its upcycle.json

    @property
    def num_layers(self) -> int:
        return len(self.config["layer_pattern"]) // 2

    @property
    def mixers(self) -> str:
        return self.config["layer_pattern"][0::2]


def open_student(folder: str | Path, role: str) -> Student:
    """The student in `folder` as `--compose`'s `role` argument (MLA_DIR or RECURRENT_DIR), checked to be one."""
    path = Path(folder).expanduser().resolve()
    where = f"--compose {role} {folder}"
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise ZebraError(f"{where}: no readable config.json", fix="pass a Zebra export folder") from None
    if config.get("model_type") != "zebra":
        raise ZebraError(f"{where}: model_type {config.get('model_type')!r}, not a Zebra export",
                         fix="pass the export of an upcycled (or ILD-trained) student")  # fmt: skip
    if not (path / REPORT_FILE).is_file():
        raise ZebraError(
            f"{where}: no {REPORT_FILE}, so its teacher is unknown",
            fix="pass a `zebra upcycle` export, or a run's export/ trained from one with --init",
        )
    student = Student(path, config, UpcycleReport.read(path / REPORT_FILE))
    layer_pattern = config["layer_pattern"]
    if len(layer_pattern) % 2 or set(layer_pattern[1::2]) != {MLP}:
        raise ZebraError(f"{where}: pattern {layer_pattern} is not mixer/MLP pairs",
                         fix="pass a student made by zebra upcycle")  # fmt: skip
    mixers = set(student.mixers)
    if role == "MLA_DIR" and mixers != {ATTENTION}:
        raise ZebraError(f"{where}: pattern {layer_pattern} is not all-MLA",
                         fix="make it with `zebra upcycle TEACHER --mla-layers all`")  # fmt: skip
    if role == "RECURRENT_DIR" and (ATTENTION in mixers or len(mixers) != 1):
        raise ZebraError(f"{where}: pattern {layer_pattern} is not all one recurrent mixer",
                         fix="make it with `zebra upcycle TEACHER --mla 0`")  # fmt: skip
    return student


def check_pair(mla: Student, recurrent: Student) -> None:
    """Refuse students of different teachers (their upcycle.json) or of different shapes (their config.json)."""
    if mla.report.teacher != recurrent.report.teacher:
        raise ZebraError(
            f"--compose: {mla.folder} was upcycled from {mla.report.teacher} but {recurrent.folder} from "
            f"{recurrent.report.teacher}",
            fix="compose two students of the same teacher",
        )
    for key in (*SHAPE_KEYS, "rms_norm_eps"):
        if mla.config.get(key) != recurrent.config.get(key):
            raise ZebraError(
                f"--compose: {key} is {mla.config.get(key)} in {mla.folder} but {recurrent.config.get(key)} "
                f"in {recurrent.folder}",
                fix="compose two students upcycled from the same teacher without --recipe changes",
            )


def choose_layers(
    num_layers: int, mla: int | None, mla_layers: str | tuple[int, ...] | None
) -> tuple[int, ...]:
    """The MLA layers of an even or explicit placement (`--mla N` or `--mla-layers`)."""
    if (mla is None) == (mla_layers is None):
        raise ZebraError("--compose needs one of --mla N and --mla-layers", fix="pass exactly one of them")
    if mla is not None:
        return mla_placement(num_layers, mla)
    layers = parse_mla_layers(mla_layers) if isinstance(mla_layers, str) else mla_layers
    return check_mla_layers(layers, num_layers)


def student_config(config: dict[str, Any], **changes: Any) -> Any:
    """A ZebraConfig from an export's config.json dict, with `changes` applied."""
    from zebra.models import ZebraConfig

    kept = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
    return ZebraConfig.from_dict({**kept, **changes})


def hybrid_config(mla: Student, recurrent: Student, mla_layers: tuple[int, ...]) -> Any:
    """The hybrid's ZebraConfig: the recurrent student's, with the MLA student's MLA shapes and the new pattern."""
    return student_config(
        recurrent.config,
        **{k: mla.config[k] for k in MLA_KEYS if k in mla.config},
        layer_pattern=pattern(recurrent.num_layers, mla_layers, recurrent.config["recurrent_type"]),
    )


def compose_inputs(
    mla_dir: str | Path, recurrent_dir: str | Path, calibration: str | None
) -> dict[str, str | Path | None]:
    """What a compose reads, for `check_output_apart`."""
    return {"MLA_DIR": mla_dir, "RECURRENT_DIR": recurrent_dir, "--calibration": calibration}


def compose(
    mla_dir: str | Path,
    recurrent_dir: str | Path,
    output: str | Path,
    *,
    mla: int | None = None,
    mla_layers: str | tuple[int, ...] | None = None,
    placement: str = "even",
    calibration: str | None = None,
    samples: int = 256,
    seq_len: int = 512,
    device: str = "auto",
    force: bool = False,
    on_progress: Callable[[float, float | None, str], None] | None = None,
) -> UpcycleReport:
    """Write the hybrid of two ILD students of one teacher as a Zebra HF export with upcycle.json.

    Args:
        mla_dir, recurrent_dir: the all-MLA and the all-recurrent student (exports with upcycle.json).
        output: the hybrid's export folder.
        mla, mla_layers: how many MLA layers (placed by `placement`), or which (then placement is explicit).
        placement: "even" (`mla_placement`) or "smart" (`zebra.upcycle.smart`, needs `calibration` and `mla`).
        calibration: SMART's data (a prepared folder, a Megatron prefix or @sample) in the teacher's tokenizer.
        samples, seq_len: SMART's calibration sequences and their length.
        device: where SMART's forwards run.
        force: replace an existing `output`.
        on_progress: per tensor written, as in `upcycle`.

    Raises:
        ZebraError: a folder that is not such a student, students of different teachers or shapes, a count
            above the layer count, SMART without calibration data or with data of another tokenizer.
    """
    if placement not in PLACEMENTS:
        raise ZebraError(f"--placement {placement}: unknown", fix=f"use one of {', '.join(PLACEMENTS)}")
    check_output_apart(output, compose_inputs(mla_dir, recurrent_dir, calibration))
    check_output(output, force=force)
    mla_student, rec_student = open_student(mla_dir, "MLA_DIR"), open_student(recurrent_dir, "RECURRENT_DIR")
    check_pair(mla_student, rec_student)
    num_layers = rec_student.num_layers
    smart: dict[str, Any] = {}
    if placement == "smart":
        from zebra.upcycle.smart import smart_placement

        if mla_layers is not None or mla is None:
            raise ZebraError("--placement smart needs --mla N (it chooses the layers)",
                             fix="pass --mla N instead of --mla-layers")  # fmt: skip
        smart = smart_placement(mla_student, rec_student, mla, calibration, samples=samples, seq_len=seq_len,
                                device=device)  # fmt: skip
        layers = tuple(smart["selected"])
    else:
        layers = choose_layers(num_layers, mla, mla_layers)
    how = "smart" if smart else ("even" if mla is not None else "explicit")
    return write_hybrid(mla_student, rec_student, layers, output, how, smart, force=force,
                        on_progress=on_progress)  # fmt: skip


def write_hybrid(
    mla: Student,
    recurrent: Student,
    layers: tuple[int, ...],
    output: str | Path,
    placement: str,
    smart: dict[str, Any],
    *,
    force: bool,
    on_progress: Callable[[float, float | None, str], None] | None,
) -> UpcycleReport:
    """The export of the hybrid with MLA at `layers` (dense indices), and its upcycle.json."""
    from zebra.convert.hf_export import export_hf
    from zebra.spec import arch
    from zebra.upcycle.readers import open_teacher

    config = hybrid_config(mla, recurrent, layers)
    out = Path(output)
    teacher = open_teacher(recurrent.report.teacher, tokenizer="none")
    source = ComposedSource(config, mla, recurrent, layers, teacher)
    s = teacher.shape
    sources = [str(mla.folder if i in layers else recurrent.folder) for i in range(recurrent.num_layers)]
    reports: list[UpcycleReport] = []

    def add_report(tmp: Path) -> None:
        reports.append(UpcycleReport(
            teacher=recurrent.report.teacher, teacher_format=teacher.format, output=str(out),
            mixer=recurrent.config["recurrent_type"], pattern=config.layer_pattern, mla_layers=list(layers),
            dtype=str(source.dtype).removeprefix("torch."), teacher_params=s.params(),
            student_params=arch.param_count(config).total,
            kv_cache_fraction=arch.teacher_kv_fraction(config, s.num_layers, s.num_kv_heads, s.head_dim),
            tensors=[source.origins[name] for name in source.shapes()],
            notes=["composed: each layer's mixer, MLP and norms from the matching student; the embeddings, "
                   "the head and the final norm from the teacher"],
            students={"mla": str(mla.folder), "recurrent": str(recurrent.folder)},
            layer_sources=sources, placement=placement, smart=smart,
        ))  # fmt: skip
        reports[0].write(tmp / REPORT_FILE)
        if smart:
            from zebra.upcycle.smart import plot_scores

            plot_scores(smart, tmp / smart["chart"])

    try:
        export_hf(source, config, out, tokenizer=_tokenizer(recurrent.folder), force=force,
                  source=f"{mla.folder} + {recurrent.folder}, composed by `zebra upcycle --compose`",
                  on_progress=on_progress, add_files=add_report)  # fmt: skip
    finally:
        source.close()
        teacher.tensors.close()
    return reports[0]


def _tokenizer(folder: Path) -> Any:
    """The student's tokenizer files to ship with the hybrid, or "none" when it has none."""
    if not (folder / "tokenizer.json").is_file():
        return "none"
    from zebra.data import load_tokenizer

    return load_tokenizer(str(folder))


class ComposedSource(TensorSource):
    """The hybrid's tensors (a `TensorSource`): layer tensors from the matching student, the embeddings, head and
    final norm from the teacher, all in the recurrent student's dtype."""

    def __init__(self, config: Any, mla: Student, recurrent: Student, layers: tuple[int, ...], teacher: Any):
        import torch

        from zebra.models import ZebraForCausalLM

        self.config, self.layers, self.teacher = config, layers, teacher
        self.mla, self.recurrent = mla, recurrent
        self.files = {folder: SafetensorsSource(folder) for folder in (mla.folder, recurrent.folder)}
        self.dtype = self.files[recurrent.folder].shapes()["model.embeddings.weight"][1]
        self.origin = f"{mla.folder} + {recurrent.folder}"
        with torch.device("meta"):
            state = ZebraForCausalLM(config).state_dict()
        self._shapes = {n: (tuple(t.shape), self.dtype) for n, t in state.items()
                        if not (config.tie_word_embeddings and n == "lm_head.weight")}  # fmt: skip
        self.origins: dict[str, TensorOrigin] = {}

    def shapes(self):
        return dict(self._shapes)

    def get(self, name: str):
        from zebra.upcycle.source import GLOBAL_COPIES

        if name in GLOBAL_COPIES:
            tensor = self.teacher.tensors.get(GLOBAL_COPIES[name]).to(self.dtype)
            where = f"teacher {GLOBAL_COPIES[name]}"
        else:
            layer = int(name.split(".")[2]) // 2  # model.layers.{sublayer}....
            folder = self.mla.folder if layer in self.layers else self.recurrent.folder
            tensor = self.files[folder].get(name).to(self.dtype)
            where = f"{folder}: {name}"
        self.origins[name] = TensorOrigin(name, list(tensor.shape), COPIED, where)
        return tensor

    def close(self) -> None:
        for source in self.files.values():
            source.close()
