"""`upcycle`: a pretrained dense Transformer -> a Zebra hybrid's HF export, with `upcycle.json` saying how."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.atomic import check_creatable, check_output_apart
from zebra.core.errors import ZebraError
from zebra.folders.model_folder import check_output
from zebra.mixers import recurrent_spec
from zebra.upcycle.calibration import Calibration, attention_input_moments
from zebra.upcycle.readers import open_teacher
from zebra.upcycle.report import TensorOrigin, UpcycleReport
from zebra.upcycle.student import StudentOptions, StudentPlan, plan_student
from zebra.upcycle.teachers.teacher import Teacher

if TYPE_CHECKING:
    from zebra.upcycle.calibrate import CalibrateOptions

DTYPES = {"auto": None, "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
REPORT_FILE = "upcycle.json"


def upcycle(
    teacher: str | Path,
    output: str | Path,
    options: StudentOptions = StudentOptions(),
    *,
    dtype: str = "auto",
    tokenizer: str | None = None,
    force: bool = False,
    seed: int = 0,
    calibration: Calibration | None = None,
    calibrate: CalibrateOptions | None = None,
    on_progress: Callable[[float, float | None, str], None] | None = None,
    on_calibrate: Callable[[float, float | None, str], None] | None = None,
) -> UpcycleReport:
    """Initialise a Zebra hybrid from a pretrained Transformer and write it as a Zebra HF export.

    Args:
        teacher: an HF model folder or hub id, a `.gguf` file, or a dense Megatron checkpoint.
        output: the export folder (written under a temporary name, then renamed).
        options: mixer, MLA placement and ranks, or a recipe (`StudentOptions`).
        dtype: "auto" keeps the teacher's dtype (copied tensors stay bit-equal); or bf16, fp16, fp32.
        tokenizer: the tokenizer to ship instead of the teacher's (name, path, `byte`, or `none`).
        force: replace an existing `output`.
        seed: seeds the recurrent mixers' own initialisation.
        calibration: text in the teacher's tokenizer for an activation-aware SVD of the MLA layers (the teacher
            runs over it once; `zebra.upcycle.calibration`); None: the published plain SVD.
        calibrate: fit every mixer to the teacher's attention on this text before writing
            (`zebra.upcycle.calibrate`); None: the student as upcycled.
        on_progress: called after each tensor with (bytes written, total bytes, the tensor's name).
        on_calibrate: called while calibrating with (steps done, total steps, a note).

    Returns:
        The report, also written to `output/upcycle.json`.

    Raises:
        ZebraError: a missing or unsupported teacher, bad options, an existing output without `force`, an
            output that is, holds or lies inside the teacher or another input (whatever `force` says).
    """
    if dtype not in DTYPES:
        raise ZebraError(f"--dtype {dtype}: unknown", fix=f"use one of {', '.join(DTYPES)}")
    check_output_apart(
        output, upcycle_inputs(teacher, options, tokenizer, calibration.data if calibration else None)
    )
    check_output(output, force=force)
    check_creatable(output, fix="choose another --output")  # before the minutes of upcycling it would lose
    opened = open_teacher(teacher, tokenizer=tokenizer)
    try:
        return upcycle_teacher(opened, output, options, dtype=dtype, force=force, seed=seed,
                               calibration=calibration, calibrate=calibrate, on_progress=on_progress,
                               on_calibrate=on_calibrate)  # fmt: skip
    finally:
        opened.tensors.close()


def upcycle_inputs(
    teacher: str | Path,
    options: StudentOptions,
    tokenizer: str | None,
    calibration: str | None,
    calibrate: str | None = None,
) -> dict[str, str | Path | None]:
    """What an upcycle reads, for `check_output_apart`: the output may be none of them, nor hold or lie in one."""
    return {
        "the teacher": teacher,
        "--recipe": options.recipe,
        "--tokenizer": tokenizer,
        "--calibration": calibration,
        "--calibrate": calibrate,
    }


def upcycle_teacher(
    teacher: Teacher,
    output: str | Path,
    options: StudentOptions = StudentOptions(),
    *,
    dtype: str = "auto",
    force: bool = False,
    seed: int = 0,
    calibration: Calibration | None = None,
    calibrate: CalibrateOptions | None = None,
    on_progress: Callable[[float, float | None, str], None] | None = None,
    on_calibrate: Callable[[float, float | None, str], None] | None = None,
) -> UpcycleReport:
    """`upcycle` for an opened teacher (`open_teacher`); the arguments are `upcycle`'s."""
    import torch

    from zebra.convert.hf_export import export_hf
    from zebra.upcycle.source import UpcycledSource

    if dtype not in DTYPES:
        raise ZebraError(f"--dtype {dtype}: unknown", fix=f"use one of {', '.join(DTYPES)}")
    out = Path(output)
    plan = plan_student(teacher.shape, options)
    config = _config(plan)
    student_dtype = getattr(torch, DTYPES[dtype]) if DTYPES[dtype] else teacher.dtype
    svd: dict[str, Any] = {"method": "plain"}
    moments = None
    if calibration is not None and plan.mla_layers:
        moments, tokens = attention_input_moments(teacher, calibration, plan.mla_layers)
        svd = {"method": "activation", "calibration": calibration.data, "tokens": tokens}
    source: Any = UpcycledSource(teacher, config, student_dtype, seed, moments)
    calibrated = None
    if calibrate is not None:
        from zebra.upcycle.calibrate import CalibratedSource, calibrate_student

        calibrated = calibrate_student(teacher, config, source, calibrate, on_progress=on_calibrate)
        source = CalibratedSource(source, calibrated)
    reports: list[UpcycleReport] = []

    def add_report(tmp: Path) -> None:
        """upcycle.json into the export before it is renamed into place (the tensors' origins are known now)."""
        reports.append(_report(teacher, plan, config, source, out, student_dtype, svd))
        if calibrated is not None:
            reports[0].calibration = calibrated.record()
            fits = calibrated.layers
            reports[0].notes.append(
                f"calibrated (not in the published recipe): every mixer fitted to the teacher's attention on "
                f"{calibrated.tokens:,} tokens of {calibrate.data}; relative output error "
                f"{max(f.error_upcycled for f in fits):.2f} at worst as upcycled, {max(f.error_fit for f in fits):.2f} "
                "at worst after"
            )
        reports[0].write(tmp / REPORT_FILE)

    export_hf(
        source,
        config,
        out,
        tokenizer=teacher.tokenizer if teacher.tokenizer is not None else "none",
        recipe=plan.recipe,
        force=force,
        source=f"{teacher.origin} ({teacher.format}), upcycled by `zebra upcycle`",
        on_progress=on_progress,
        add_files=add_report,
    )
    return reports[0]


def _config(plan: StudentPlan) -> Any:
    from zebra.models import ZebraConfig

    try:
        return ZebraConfig(**plan.config)
    except ValueError as e:
        raise ZebraError(str(e), fix="choose other shapes (see zebra upcycle --help)") from None


def _report(
    teacher: Teacher, plan: StudentPlan, config: Any, source: Any, out: Path, dtype: Any, svd: dict[str, Any]
) -> UpcycleReport:
    from zebra.spec import arch

    s = teacher.shape
    from zebra.upcycle.teachers.teacher import resolve_teacher_spec

    tensors = [source.origins[name] for name in source.shapes()]
    return UpcycleReport(
        teacher=resolve_teacher_spec(str(teacher.origin)),  # absolute when local: compose / ILD find it again
        teacher_format=teacher.format,
        output=str(out),
        mixer=plan.mixer,
        pattern=config.layer_pattern,
        mla_layers=list(plan.mla_layers),
        dtype=str(dtype).removeprefix("torch."),
        teacher_params=s.params(),
        student_params=arch.param_count(config).total,
        kv_cache_fraction=arch.teacher_kv_fraction(config, s.num_layers, s.num_kv_heads, s.head_dim),
        tensors=tensors,
        notes=notes(teacher, plan, tensors, svd),
        svd=svd,
    )


# Below this share of [W_k; W_v]'s squared singular values in some layer's KV latent, the report warns: a
# student whose latents keep far less starts at a uniform guess (docs/upcycle.md has SmolLM2-135M's shares).
KV_ENERGY_WARNING = 0.9


def notes(teacher: Teacher, plan: StudentPlan, tensors: list[TensorOrigin], svd: dict[str, Any]) -> list[str]:
    """What the report must say about approximations and unpublished parts (`svd`: the report's `svd` record)."""
    activation = svd["method"] == "activation"
    s = teacher.shape
    out = list(teacher.notes)
    if plan.mla_layers:
        out.append(
            "MLA from GQA is approximate: truncated SVDs, one RoPE key shared by all heads (the mean over KV "
            f"heads), RoPE on {plan.config['qk_rope_head_dim']} of {s.head_dim} channels per head with the "
            "student's own frequencies"
            + (", and latent RMSNorms that rescale each token" if plan.config.get("mla_latent_norm") else "")
        )
        if activation:
            out.append(
                f"activation-aware SVD (not the published plain SVD): the MLA factors keep most of W x on "
                f"{svd['tokens']:,} tokens of {svd['calibration']}"
            )
        kept = [t.energy for t in tensors if t.name.endswith("kv_down_proj.weight") and t.energy is not None]
        if kept and min(kept) < KV_ENERGY_WARNING:
            out.append(
                f"the KV latent (rank {plan.config['kv_lora_rank']}) keeps {min(kept):.0%} to {max(kept):.0%} of "
                + (
                    "the output energy of [W_k; W_v] on the calibration text"
                    if activation
                    else "[W_k; W_v]'s energy"
                )
                + ": the student starts far from the teacher and needs distillation (ILD first); "
                + "a larger --kv-lora-rank keeps more, at a larger KV cache"
                + ("" if activation else "; --svd activation --calibration DATA keeps more at the same rank")
            )
    note = recurrent_spec(plan.mixer).upcycle.note  # what the mixer's route from attention follows
    if note:
        out.append(note)
    if s.qkv_bias:
        out.append("the teacher's q/k/v biases are dropped: the student's projections have none")
    if s.qk_norm:
        out.append(
            "the teacher's q/k RMSNorm weights are folded into W_q / W_k; the per-token normalisation is dropped"
        )
    if s.rope_scaling:
        factor = plan.config.get("rope_scaling", {}).get("factor", 1.0)
        out.append(
            f"the teacher's RoPE scaling ({s.rope_scaling}) becomes YaRN over the MLA RoPE channels, factor "
            f"{factor:g} (the recurrent mixers have no positions)"
            if factor > 1.0
            else f"the teacher's RoPE scaling ({s.rope_scaling}) is not carried over: the student uses plain RoPE"
        )
    return out
