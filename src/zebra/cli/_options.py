"""Option types shared by several commands (HF `_cli_utils` style): each flag is declared once, here."""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer

from zebra.chat import MAX_NEW_TOKENS

YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Never prompt: take defaults, confirm downloads and overwrites.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override a recipe field, e.g. --set train.lr=3e-4 (repeatable).",
        metavar="KEY=VALUE",
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing output.")]

# Loading a model (zebra.core.device reads --device and --dtype).
DeviceOpt = Annotated[
    str | None, typer.Option("--device", help="cpu, cuda, cuda:N or auto (default: cuda if any).")
]
DecodeDTypeOpt = Annotated[
    str, typer.Option("--dtype", help="auto (bf16 on GPU, the checkpoint's on CPU), bf16, fp16, fp32.")
]
CudaGraphOpt = Annotated[
    bool,
    typer.Option("--cuda-graph/--no-cuda-graph", help="Capture the decode step in a CUDA graph (GPU only)."),
]
CompileOpt = Annotated[bool, typer.Option("--compile", help="torch.compile the decode step (GPU only).")]


# Token sampling (zebra.generation.SamplingParams); each command picks its own defaults.
def _temperature(value: float) -> float:
    """`--temperature` is a finite number >= 0 (inf would divide every score to 0, nan poisons them)."""
    if not (math.isfinite(value) and value >= 0.0):
        raise typer.BadParameter(f"{value} is not a finite number >= 0 (0 = greedy)")
    return value


TemperatureOpt = Annotated[
    float, typer.Option("--temperature", callback=_temperature, help="0 = greedy; a finite number >= 0.")
]
TopKOpt = Annotated[int, typer.Option("--top-k", min=0, help="Sample from the k most likely (0 = all).")]


def _nucleus_mass(value: float) -> float:
    """`--top-p` is in (0, 1], SamplingParams' range: click's ranges are closed, and 0 would keep no token."""
    if not 0.0 < value <= 1.0:
        raise typer.BadParameter(f"{value} is not in the range 0<x<=1 (1 = no limit)")
    return value


TopPOpt = Annotated[
    float, typer.Option("--top-p", callback=_nucleus_mass, help="Nucleus sampling mass, in (0, 1].")
]


def max_new_option(help_text: str) -> Any:
    """`--max-new`: new tokens at most, 1 to MAX_NEW_TOKENS; `help_text` says what they make.

    Use as `max_new: Annotated[int, max_new_option("...")] = 128`.
    """
    return typer.Option("--max-new", min=1, max=MAX_NEW_TOKENS, help=help_text)


def tokenizer_option(default: str, *, short: bool = False) -> Any:
    """`--tokenizer` (an HF name or hub id, a folder, or `byte`); `default` says what happens without it.

    Use as `tokenizer: Annotated[str | None, tokenizer_option("the model's")] = None`.
    """
    return typer.Option(
        "--tokenizer",
        *(["-t"] if short else []),
        help=f"Tokenizer: an HF name or hub id, a folder, or byte (built in); default: {default}.",
    )


def examples(*lines: str) -> str:
    """An epilog listing example invocations."""
    return "Examples:\n\n" + "\n\n".join(f"  $ {line}" for line in lines)


# Calibration of an upcycled student (zebra upcycle --calibrate DATA, zebra distill): each flag maps to a setting of
# zebra.upcycle.calibrate.calibrate_options (None: its default), which checks them in one line.
CalibrateSamplesOpt = Annotated[
    int | None, typer.Option("--calibrate-samples", help="Calibration: sequences of text [16; 128 on a GPU].")
]
CalibrateSeqLenOpt = Annotated[
    int | None,
    typer.Option("--calibrate-seq-len", help="Calibration: tokens per sequence [128; 512 on a GPU]."),
]
CalibrateStepsOpt = Annotated[
    int | None,
    typer.Option(
        "--calibrate-steps",
        help="Calibration: Adam steps per mixer layer (0: gates only) [50; 600 on a GPU].",
    ),
]
CalibrateBatchOpt = Annotated[
    int | None, typer.Option("--calibrate-batch", help="Calibration: sequences per fit step [2; 8 on a GPU].")
]
CalibrateWorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--calibrate-workers",
        help="Calibration: processes fitting the layers side by side, spread over the GPUs [one per GPU; 1 on the CPU].",
    ),
]
CalibrateLrOpt = Annotated[
    float | None, typer.Option("--calibrate-lr", help="Calibration: Adam LR of the fit [1e-3].")
]
CalibrateScheduleOpt = Annotated[
    str | None,
    typer.Option("--calibrate-schedule", help="Calibration: LR over the steps, constant or cosine."),
]
CalibrateTeacherForcedOpt = Annotated[
    bool | None,
    typer.Option(
        "--calibrate-teacher-forced/--calibrate-sequential",
        help="Calibration: fit each mixer on the teacher's input to its layer, or on the student's own stream "
        "(with the drift so far added to its target) [teacher-forced].",
    ),
]
CalibrateCorrectResidualOpt = Annotated[
    float | None,
    typer.Option(
        "--calibrate-correct-residual",
        help="Calibration: share of the teacher-student stream gap each mixer also takes out, 0 to 1 [1].",
    ),
]
CalibrateOutputLstsqOpt = Annotated[
    bool,
    typer.Option(
        "--calibrate-output-lstsq", help="Calibration: the output projection by least squares before the fit."
    ),
]
CalibratePassThroughOpt = Annotated[
    bool | None,
    typer.Option(
        "--calibrate-pass-through/--calibrate-keep-init",
        help="Calibration: identity short convs and steady output gates before the fit [on], or their own init.",
    ),
]
