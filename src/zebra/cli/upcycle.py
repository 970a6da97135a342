"""`zebra upcycle`: initialise a Zebra hybrid from a pretrained dense Transformer (HF, GGUF or Megatron)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    ForceOpt,
    JsonOpt,
    YesOpt,
    examples,
)
from zebra.cli._output import out
from zebra.cli._prompt import confirm_overwrite
from zebra.core.errors import ZebraError

SVD_METHODS = ("plain", "activation")
EXAMPLES = examples(
    "zebra upcycle meta-llama/Llama-3.2-1B-Instruct --output zebra-1b --mla 4      # MLA at layers 0,5,10,14",
    "zebra upcycle SmolLM2-135M-Instruct.Q4_1.gguf --output smol-gdn --mixer gdn --mla-layers 0,14,28",
    "zebra upcycle primus/llama-ckpt --output zebra-3b --recipe 3b-mamba-mla --dtype bf16",
    "zebra upcycle SmolLM2-135M-Instruct.Q4_1.gguf -o smol-mla --mla-layers all --svd activation --calibration data/train",
    "zebra upcycle --compose ild-mla/export ild-mamba/export --mla 4 --placement smart --calibration data/ -o hybrid",
)


def upcycle_command(
    output: Annotated[Path, typer.Option("--output", "-o", help="The Zebra HF export to write.")],
    teacher: Annotated[
        str | None,
        typer.Argument(help="HF model folder or hub id, a .gguf file, or a dense Megatron checkpoint."),
    ] = None,
    mixer: Annotated[
        str | None,
        typer.Option(
            "--mixer",
            help="Recurrent mixer (default mamba): a mixer that attention copies into (docs/upcycle.md).",
        ),
    ] = None,
    mla: Annotated[
        int | None,
        typer.Option("--mla", help="Number of MLA layers: layer 0 and L-2 always, gaps as even as possible."),
    ] = None,
    mla_layers: Annotated[
        str | None,
        typer.Option("--mla-layers", help="Dense layers that become MLA, e.g. 0,5,10,14, or all."),
    ] = None,
    compose: Annotated[
        tuple[Path, Path] | None,
        typer.Option("--compose", help="MLA_DIR RECURRENT_DIR: the hybrid of two ILD students, no TEACHER."),
    ] = None,
    placement: Annotated[
        str,
        typer.Option(
            "--placement", help="With --compose --mla N: even, or smart (by KL, needs --calibration)."
        ),
    ] = "even",
    svd: Annotated[
        str,
        typer.Option(
            "--svd",
            help="MLA factors: plain (published), or activation (fits W x on --calibration text; keeps more).",
        ),
    ] = "plain",
    calibration: Annotated[
        str | None,
        typer.Option(
            "--calibration",
            help="Text for SMART or --svd activation: a prepared folder or prefix, teacher's tokenizer.",
        ),
    ] = None,
    calibration_samples: Annotated[
        int, typer.Option("--calibration-samples", help="Calibration sequences.", min=1, max=1_000_000)
    ] = 256,
    seq_len: Annotated[
        int, typer.Option("--seq-len", help="Calibration sequence length.", min=8, max=1 << 20)
    ] = 512,
    device: Annotated[
        str, typer.Option("--device", help="Where the calibration runs: auto, cpu, cuda.")
    ] = "auto",
    calibrate: Annotated[
        str | None,
        typer.Option(
            "--calibrate",
            help="Fit every new mixer to the teacher's attention on this text (teacher's tokenizer) before writing.",
        ),
    ] = None,
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
    kv_lora_rank: Annotated[
        int | None, typer.Option("--kv-lora-rank", help="MLA key/value latent rank (the cached latent).")
    ] = None,
    q_lora_rank: Annotated[
        int | None, typer.Option("--q-lora-rank", help="MLA query latent rank (0: no query compression).")
    ] = None,
    qk_rope_head_dim: Annotated[
        int | None, typer.Option("--qk-rope-head-dim", help="MLA channels per head with RoPE.")
    ] = None,
    latent_norm: Annotated[
        bool | None,
        typer.Option(
            "--latent-norm/--no-latent-norm",
            help="RMSNorm on the MLA latents (default: none, as published; with --recipe, the recipe's).",
        ),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option("--recipe", help="Take the student's shapes from this recipe (name or path)."),
    ] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="auto (the teacher's), bf16, fp16 or fp32.")] = "auto",
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="Tokenizer to ship (default: the teacher's; none: no files)."),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the recurrent mixers' own initialisation.")
    ] = 0,
    force: ForceOpt = False,
    yes: YesOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Initialise a hybrid from a Transformer: copy embeddings, norms and MLPs, factorise attention into MLA,
    copy Q/K/V/O into the recurrent mixers; write a Zebra HF export with upcycle.json."""
    from zebra.core.atomic import check_output_apart, sigterm_raises
    from zebra.upcycle.calibrate import calibrate_options
    from zebra.upcycle.calibration import Calibration
    from zebra.upcycle.compose import compose_inputs
    from zebra.upcycle.run import upcycle, upcycle_inputs
    from zebra.upcycle.student import StudentOptions, parse_mla_layers

    if svd not in SVD_METHODS:
        raise ZebraError(f"--svd {svd}: unknown", fix=f"use one of {', '.join(SVD_METHODS)}")
    fitting = calibrate_options(
        calibrate, device, samples=calibrate_samples, seq_len=calibrate_seq_len, steps=calibrate_steps,
        batch=calibrate_batch, lr=calibrate_lr, schedule=calibrate_schedule, teacher_forced=calibrate_teacher_forced,
        correct_residual=calibrate_correct_residual, output_lstsq=calibrate_output_lstsq,
        pass_through=calibrate_pass_through, workers=calibrate_workers,
    )  # fmt: skip
    if (teacher is None) == (compose is None):
        raise ZebraError("pass a TEACHER or --compose MLA_DIR RECURRENT_DIR (one of them)",
                         fix="zebra upcycle TEACHER -o OUT, or zebra upcycle --compose A B --mla N -o OUT")  # fmt: skip
    if compose is not None:  # before any question: no answer and no --force may replace what is read
        check_output_apart(output, compose_inputs(*compose, calibration))
    else:
        check_output_apart(
            output, upcycle_inputs(teacher, StudentOptions(recipe=recipe), tokenizer, calibration, calibrate)
        )
    force = confirm_overwrite(output, force=force, yes=yes)
    if compose is not None:
        if calibrate is not None:
            raise ZebraError("--calibrate applies to a TEACHER's upcycle, not to --compose",
                             fix="calibrate when upcycling the students from the teacher")  # fmt: skip
        if svd != "plain":
            raise ZebraError("--svd applies to a TEACHER's upcycle: --compose takes its students' MLA layers as they are",
                             fix="pass --svd activation when upcycling the students from the teacher")  # fmt: skip
        from zebra.upcycle.compose import compose as compose_students

        with sigterm_raises("upcycle"), out.progress("composing", unit="B", enabled=not json_) as bar:
            report = compose_students(*compose, output, mla=mla, mla_layers=mla_layers, placement=placement,
                                      calibration=calibration, samples=calibration_samples, seq_len=seq_len,
                                      device=device, force=force, on_progress=bar)  # fmt: skip
        _show(report, json_)
        return
    if placement != "even":
        raise ZebraError("--placement smart needs --compose MLA_DIR RECURRENT_DIR",
                         fix="ILD-train an all-MLA and an all-recurrent student first (docs/upcycle.md)")  # fmt: skip
    if (svd == "activation") != (calibration is not None):
        raise ZebraError(
            "--svd activation needs --calibration DATA"
            if calibration is None
            else "--calibration without --compose is for --svd activation",
            fix="pass both --svd activation and --calibration DATA (text in the teacher's tokenizer), or neither",
        )
    options = StudentOptions(
        mixer=mixer,
        mla=mla,
        mla_layers=parse_mla_layers(mla_layers) if mla_layers is not None else None,
        kv_lora_rank=kv_lora_rank,
        q_lora_rank=q_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        recipe=recipe,
        latent_norm=latent_norm,
    )
    bars = _Phases(enabled=not json_)
    with sigterm_raises("upcycle"), bars:
        report = upcycle(
            teacher,
            output,
            options,
            dtype=dtype,
            tokenizer=tokenizer,
            force=force,
            seed=seed,
            calibration=Calibration(calibration, calibration_samples, seq_len, device)
            if calibration
            else None,
            calibrate=fitting,
            on_progress=bars.phase("upcycling", unit="B"),
            on_calibrate=bars.phase("calibrating", unit="steps"),
        )
    _show(report, json_)


class _Phases:
    """One transient bar at a time (Rich draws one live display): each phase's callback opens its own bar at its
    first call and closes the previous phase's."""

    def __init__(self, enabled: bool):
        self.enabled, self.name, self.bar = enabled, "", None

    def phase(self, description: str, unit: str):
        def callback(done: float, total: float | None = None, note: str = "") -> None:
            if self.name != description:
                self.close()
                self.name, self.bar = description, out.progress(description, unit=unit, enabled=self.enabled)
                self.bar.__enter__()
            self.bar(done, total, note)

        return callback

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def __enter__(self) -> _Phases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _show(report, json_: bool) -> None:
    """The report as JSON, or as the provenance table, SMART's scores and a summary."""
    if json_:
        out.json(report.to_dict())
        return
    out.table(
        ["tensor", "shape", "from", "how"],
        [[t.name, "x".join(map(str, t.shape)), t.source or "", _how(t)] for t in report.tensors],
        title=f"{report.teacher} ({report.teacher_format}) -> {report.output}",
    )
    if report.smart:
        _show_scores(report)
    if report.calibration:
        _show_calibration(report.calibration)
    counts = ", ".join(f"{n} {how}" for how, n in report.counts().items())
    out.text(f"pattern {report.pattern} ({report.mixer}, MLA at layers {report.mla_layers or 'none'})")
    out.text(f"tensors: {counts}")
    out.text(
        f"parameters {report.student_params:,} (teacher {report.teacher_params:,}); "
        f"KV cache {100 * report.kv_cache_fraction:.2f}% of the teacher's per token"
    )
    for note in report.notes:
        out.warn(note)
    out.result(f"wrote {report.output} ({report.dtype}); its provenance is in {report.output}/upcycle.json")
    out.hint(f"check it: zebra generate {report.output} --prompt 'The capital of France is'")


def _show_scores(report) -> None:
    smart, chosen = report.smart, set(report.mla_layers)
    out.table(
        ["layer", "KL with this layer MLA", "score (KL lowered)", "MLA"],
        [
            [i, f"{kl:.5f}", f"{score:+.5f}", "yes" if i in chosen else ""]
            for i, (kl, score) in enumerate(zip(smart["kl"], smart["scores"], strict=True))
        ],
        title=f"SMART: KL of the all-recurrent student {smart['baseline_kl']:.5f} on {smart['sequences']} "
        f"sequences of {smart['calibration']}",
    )
    out.text(f"scores chart: {smart['chart']}")


def _show_calibration(calibration: dict) -> None:
    """Each mixer's relative output error against the teacher's attention, before and after calibrating."""
    columns = ("error_upcycled", "error_init", "error_fit")
    out.table(
        ["layer", "mixer", "upcycled", "gates set", "fitted", "best step"],
        [
            [f["layer"], f["mixer"], *(f"{f[c]:.3f}" for c in columns), f["best_step"]]
            for f in calibration["layers"]
        ],
        title=f"calibration: ||y - y_teacher|| / ||y_teacher|| on {calibration['tokens']:,} tokens of "
        f"{calibration['data']}, {calibration['steps']} steps a layer",
    )


def _how(t) -> str:
    return f"{t.how}: {t.detail}" if t.detail else t.how
