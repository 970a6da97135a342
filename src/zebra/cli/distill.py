"""`zebra distill TEACHER --data DIR --tokens 50M -o OUT`: the whole pipeline (upcycle and calibrate two students,
ILD each with --ild-fraction, compose with SMART, KD) in one run folder, resumable; the logic is
`zebra.train.pipeline`'s."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zebra.cli._options import (
    CalibrateBatchOpt,
    CalibrateCorrectResidualOpt,
    CalibrateLrOpt,
    CalibrateOutputLstsqOpt,
    CalibratePassThroughOpt,
    CalibrateSamplesOpt,
    CalibrateScheduleOpt,
    CalibrateSeqLenOpt,
    CalibrateStepsOpt,
    CalibrateTeacherForcedOpt,
    CalibrateWorkersOpt,
    JsonOpt,
    examples,
)
from zebra.cli._output import RichTrainView, out
from zebra.core.errors import ZebraError
from zebra.train.pipeline import PipelineView
from zebra.train.view import TrainView

if TYPE_CHECKING:
    from zebra.train.pipeline import PipelineResult, Stage

EXAMPLES = examples(
    "zebra distill SmolLM2-135M-Instruct.Q4_1.gguf --data data/train --tokens 50M -o smol-distilled",
    "zebra distill meta-llama/Llama-3.2-1B-Instruct --data corpus/train --tokens 200M --mla 4 --mixer gdn -o llama-gdn",
    "zebra distill teacher/ --data data/train --tokens 2M --seq-len 512 --batch 4 --device cpu -o small",
)
SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}


def parse_tokens(text: str) -> int:
    """`50M` -> 50_000_000 (k, M, B; a plain count too); a one-line ZebraError otherwise."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbBgG]?)\s*", text)
    if found is None or float(found.group(1)) <= 0:
        raise ZebraError(f"--tokens {text}: not a token count", fix="pass a count such as 50M, 2.5M or 800k")
    return int(float(found.group(1)) * SUFFIXES[found.group(2).lower()])


class PipelineConsole(PipelineView):
    """The pipeline on this console: a line per stage, the trainer's live bar (stage, step, tokens, held-out CE
    against the teacher's, ETA) in training stages; nothing but the result with --json."""

    def __init__(self, json_: bool):
        self.json = json_

    def stage_started(self, index: int, total: int, stage: Stage, steps: int) -> None:
        if not self.json:
            what = f", {steps} steps" if steps else ""
            out.text(f"[bold]stage {index}/{total}: {stage.name}[/] ({stage.kind}{what})")

    def stage_skipped(self, stage: Stage, result: dict[str, Any]) -> None:
        if not self.json:
            out.note(f"{stage.name}: done before, skipped")

    def stage_done(self, stage: Stage, result: dict[str, Any]) -> None:
        if not self.json and result.get("heldout_ce") is not None:
            teacher = result.get("teacher_heldout_ce")
            versus = f" (teacher {teacher:.4f})" if teacher is not None else ""
            out.note(f"{stage.name}: held-out CE {result['heldout_ce']:.4f}{versus}")

    def stage_progress(self, stage: Stage):
        return out.progress(f"{stage.name} calibrating", unit="steps", enabled=not self.json)

    def train_view(self, stage: Stage, tokens_before: int) -> TrainView:
        return (
            TrainView()
            if self.json
            else RichTrainView(out, label=f"{stage.name} ", tokens_before=tokens_before)
        )


def distill_command(
    teacher: Annotated[str, typer.Argument(help="HF model folder or hub id, a .gguf file, or a dense Megatron checkpoint.")],
    data: Annotated[str, typer.Option("--data", help="Training text in the teacher's tokenizer: a prepared folder or prefix.")],
    tokens: Annotated[str, typer.Option("--tokens", help="Training tokens over all stages, e.g. 50M.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The pipeline's folder (run again to continue).")],
    mixer: Annotated[str, typer.Option("--mixer", help="Recurrent mixer: mamba, gdn or kda.")] = "mamba",
    mla: Annotated[int, typer.Option("--mla", help="MLA layers of the hybrid (placed by SMART).", min=1)] = 8,
    placement: Annotated[str, typer.Option("--placement", help="smart (by KL to the teacher) or even.")] = "smart",
    seq_len: Annotated[int, typer.Option("--seq-len", help="Training sequence length.", min=8)] = 2048,
    batch: Annotated[int, typer.Option("--batch", help="Sequences per optimizer step.", min=1)] = 8,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per forward.", min=1)] = 8,
    ild_fraction: Annotated[float, typer.Option("--ild-fraction", help="Share of --tokens for ILD (0: none, the calibrated students composed as they are; the published pipeline: 0.2).", min=0.0, max=0.9)] = 0.0,
    ild_lr: Annotated[float, typer.Option("--ild-lr", help="Peak LR of the ILD stages.")] = 5e-4,
    kd_lr: Annotated[float, typer.Option("--kd-lr", help="Peak LR of KD.")] = 3e-4,
    evals: Annotated[int, typer.Option("--evals", help="Held-out evaluations and checkpoints per stage.", min=1)] = 4,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    calibrate: Annotated[bool, typer.Option("--calibrate/--no-calibrate", help="Fit each upcycled student's mixers to the teacher's attention on --data first.")] = True,
    calibrate_samples: CalibrateSamplesOpt = None,
    calibrate_seq_len: CalibrateSeqLenOpt = None,
    calibrate_steps: CalibrateStepsOpt = None,
    calibrate_batch: CalibrateBatchOpt = None,
    calibrate_workers: CalibrateWorkersOpt = None,
    calibrate_lr: CalibrateLrOpt = None,
    calibrate_schedule: CalibrateScheduleOpt = None,
    calibrate_teacher_forced: CalibrateTeacherForcedOpt = None,
    calibrate_correct_residual: CalibrateCorrectResidualOpt = None,
    calibrate_output_lstsq: CalibrateOutputLstsqOpt = False,
    calibrate_pass_through: CalibratePassThroughOpt = None,
    upcycled_from: Annotated[Path | None, typer.Option("--upcycled-from", help="Take the upcycle stages of another zebra distill folder (same teacher, --data, --mixer, --calibrate-*) instead of calibrating again: to try ILD or KD settings.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Recipe override for every training stage (distill.*, train.*).")] = None,
    json_: JsonOpt = False,
) -> None:  # fmt: skip
    """Distil a hybrid from a Transformer in one command: upcycle and calibrate an all-MLA and an all-recurrent
    student (ILD each with --ild-fraction), compose them (MLA where SMART says), KD the hybrid; OUTPUT/kd/export is
    the student."""
    from zebra.train.pipeline import PipelineOptions, calibration_fields, run_pipeline
    from zebra.upcycle.calibrate import calibrate_options

    fitting = calibrate_options(
        data if calibrate else None, device, off="with --no-calibrate", samples=calibrate_samples,
        seq_len=calibrate_seq_len, steps=calibrate_steps, batch=calibrate_batch, lr=calibrate_lr,
        schedule=calibrate_schedule, teacher_forced=calibrate_teacher_forced,
        correct_residual=calibrate_correct_residual, output_lstsq=calibrate_output_lstsq,
        pass_through=calibrate_pass_through, workers=calibrate_workers,
    )  # fmt: skip
    options = PipelineOptions(
        teacher=teacher, data=data, tokens=parse_tokens(tokens), output=str(output), mixer=mixer, mla=mla,
        placement=placement, seq_len=seq_len, batch=batch, micro_batch=micro_batch, ild_fraction=ild_fraction,
        ild_lr=ild_lr, kd_lr=kd_lr, evals=evals, device=device, calibrate=calibrate, sets=tuple(set_ or ()),
        upcycled_from=None if upcycled_from is None else str(upcycled_from), **calibration_fields(fitting),
    )  # fmt: skip
    result = run_pipeline(options, PipelineConsole(json_))
    _show(result, json_)


def _show(result: PipelineResult, json_: bool) -> None:
    if json_:
        out.json({"output": str(result.output), "stopped_by": result.stopped_by, "student": result.student,
                  "stages": result.stages})  # fmt: skip
        return
    rows = []
    for name, entry in result.stages.items():
        r = entry.get("result", {})
        ce, teacher = r.get("heldout_ce"), r.get("teacher_heldout_ce")
        rows.append([name, entry["status"], f"{r['tokens']:,}" if "tokens" in r else "-",
                     f"{ce:.4f}" if ce is not None else "-", f"{teacher:.4f}" if teacher is not None else "-",
                     f"{ce / teacher:.3f}" if ce is not None and teacher else "-",
                     f"{r['seconds']:,.0f}" if "seconds" in r else "-"])  # fmt: skip
    columns = ["stage", "status", "tokens", "held-out CE", "teacher", "ratio", "seconds"]
    seconds = sum(entry.get("result", {}).get("seconds", 0.0) for entry in result.stages.values())
    out.table(columns, rows, title=f"zebra distill, {seconds:,.0f} s in all",
              justify={c: "right" for c in columns[2:]})  # fmt: skip
    if result.stopped_by:
        out.result(f"stopped by {result.stopped_by}; run the same command again to continue")
    else:
        out.result(f"distilled student: {result.student} (curves: {result.output / 'loss.png'})")
