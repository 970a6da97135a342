"""Calibration (`zebra upcycle TEACHER --calibrate DATA`): a student that starts close to its teacher.

On a few thousand tokens of DATA (in the teacher's tokenizer), before the export is written:

1. the teacher runs once; every layer's attention input, output and per-head distance / entropy are recorded
   (`zebra.upcycle.attention_records`);
2. each recurrent mixer gets its decay (and beta) from its teacher heads, and each mixer a least-squares scale per
   head of its output projection (`zebra.upcycle.gates`);
3. each mixer, recurrent or MLA, is fitted on its own to its teacher layer's attention output, teacher-forced with
   the teacher's input to that layer (`zebra.upcycle.fit`); the layers are independent, so one pass over the
   recorded layers fits them all. MLPs, norms and embeddings are not touched.

`calibrate_student` is the library entry point (a pipeline stage calls it the same way); `CalibratedSource` puts
the fitted tensors into the export in place of the upcycled ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from zebra.convert.tensor_sources import TensorSource
from zebra.core.errors import ZebraError
from zebra.mixers import MLP, mixer_spec
from zebra.upcycle.fit import FitOptions, LayerFit
from zebra.upcycle.report import FITTED, TensorOrigin

if TYPE_CHECKING:
    import torch

    from zebra.upcycle.teachers.teacher import Teacher


@dataclass(frozen=True)
class CalibrateOptions:
    """The calibration text and how each mixer is fitted."""

    data: str  # a prepared folder or Megatron prefix in the teacher's tokenizer (as --calibration takes)
    samples: int = 16  # sequences
    seq_len: int = 128  # tokens per sequence
    device: str = "auto"  # where the teacher runs and the mixers are fitted
    fit: FitOptions = field(default_factory=FitOptions)
    sequential: bool = False  # True: each mixer on the student's own stream, earlier ones fitted first
    correct_residual: float = 1.0  # sequential: the target adds this share of the teacher-student stream gap
    workers: int = 0  # processes fitting the layers at once (0: one per GPU of `cuda`, else 1; fit_workers)

    def __post_init__(self) -> None:
        check_calibrate_options(self)


# the size of the calibration on a GPU: 128 x 512 tokens, 600 steps of 8 sequences a layer, about 100 s a student on
# one H100 and 1.49x the teacher's held-out CE for the composed Mamba2 + 8 MLA student (docs/upcycle.md, "More
# calibration"); the dataclasses' defaults (16 x 128 tokens, 50 steps of 2) are the CPU's, minutes there
GPU_SIZE = {"samples": 128, "seq_len": 512, "steps": 600, "batch": 8}


def default_size(device: str) -> dict[str, int]:
    """The calibration's samples, seq_len, steps and batch when not given: GPU_SIZE where `device` is a GPU (`auto`
    on a machine with one), the dataclasses' defaults on the CPU."""
    from zebra.core.device import resolve_device

    if resolve_device(device) != "cpu":
        return dict(GPU_SIZE)
    return {"samples": CalibrateOptions.samples, "seq_len": CalibrateOptions.seq_len, "steps": FitOptions.steps,
            "batch": FitOptions.batch}  # fmt: skip


def sized(given: dict[str, int | None], device: str) -> dict[str, int]:
    """`given` (samples, seq_len, steps, batch; None: not given) with `default_size(device)` where not given; a
    default batch is at most the samples."""
    size = {k: v for k, v in given.items() if v is not None}
    if len(size) < 4:
        default = default_size(device)
        size = {**default, "batch": min(default["batch"], size.get("samples", default["samples"])), **size}
    return size


SCHEDULES = ("constant", "cosine")
# the calibration's settings as `zebra upcycle` and `zebra distill` take them: --calibrate-<key with dashes>
SETTINGS = ("samples", "seq_len", "steps", "batch", "lr", "schedule", "teacher_forced", "correct_residual",
            "output_lstsq", "pass_through", "workers")  # fmt: skip


def flag(key: str) -> str:
    """The command-line flag of a calibration setting: `seq_len` -> `--calibrate-seq-len`."""
    return "--calibrate-" + key.replace("_", "-")


def check_calibrate_options(o: CalibrateOptions) -> None:
    """One-line ZebraError, naming the flag, for a calibration setting out of its range."""
    f = o.fit
    bad = [
        ("samples", o.samples, o.samples >= 1, "a count of sequences >= 1"),
        ("seq_len", o.seq_len, o.seq_len >= 8, "a length of 8 tokens or more"),
        ("steps", f.steps, f.steps >= 0, "a count >= 0 (0: the gates only)"),
        ("batch", f.batch, 1 <= f.batch <= o.samples, f"between 1 and --calibrate-samples ({o.samples})"),
        ("lr", f.lr, math.isfinite(f.lr) and f.lr > 0, "a finite learning rate > 0, e.g. 1e-3"),
        ("schedule", f.schedule, f.schedule in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
        ("correct_residual", o.correct_residual, 0.0 <= o.correct_residual <= 1.0, "a share between 0 and 1"),
        ("workers", o.workers, o.workers >= 0, "a count of processes >= 1, or 0 for the default"),
    ]
    for key, value, ok, want in bad:
        if not ok:
            raise ZebraError(f"{flag(key)} {value}: out of range", fix=f"pass {want}")
    if o.sequential and o.workers > 1:
        raise ZebraError(f"{flag('workers')} {o.workers} with --calibrate-sequential: each mixer is fitted on the "
                         "stream of the ones before it, one at a time",
                         fix="pass --calibrate-workers 1 or leave it out, or fit teacher-forced")  # fmt: skip
    if f.eval_every < 1:
        raise ZebraError(f"calibration eval_every {f.eval_every}: out of range", fix="pass 1 or more")


def calibrate_options(
    data: str | None, device: str = "auto", off: str = "without --calibrate DATA", **given: Any
) -> CalibrateOptions | None:
    """The `CalibrateOptions` of the commands' `--calibrate-*` flags (`SETTINGS`; None: the default), or None when
    `data` is None. Refused in one line, naming the flag: a setting given without calibration (`off` says why
    there is none), `--calibrate-correct-residual` with a teacher-forced calibration, a value out of range."""
    unknown = set(given) - set(SETTINGS)
    if unknown:
        raise TypeError(f"calibrate_options: unknown settings {sorted(unknown)}")
    chosen = {k: v for k, v in given.items() if v is not None and not (k == "output_lstsq" and v is False)}
    if data is None:
        if chosen:
            key = next(iter(chosen))
            raise ZebraError(f"{given_flag(key, chosen[key])} {off}: there is no calibration to apply it to",
                             fix="pass --calibrate DATA too, or leave the --calibrate-* options out")  # fmt: skip
        return None
    defaults, fit_defaults = CalibrateOptions(""), FitOptions()
    size = sized({k: chosen.get(k) for k in ("samples", "seq_len", "steps", "batch")}, device)
    teacher_forced = chosen.get("teacher_forced", not defaults.sequential)
    if teacher_forced and "correct_residual" in chosen:
        default = "" if "teacher_forced" in chosen else " (the default)"
        raise ZebraError(f"{flag('correct_residual')} with {flag('teacher_forced')}{default}: the correction is of "
                         "the student's own stream, which a teacher-forced fit does not use",
                         fix="pass --calibrate-sequential, or leave --calibrate-correct-residual out")  # fmt: skip
    fit = FitOptions(steps=size["steps"], batch=size["batch"],
                     **{k: chosen.get(k, getattr(fit_defaults, k))
                        for k in ("lr", "schedule", "output_lstsq", "pass_through")})  # fmt: skip
    return CalibrateOptions(
        data,
        samples=size["samples"],
        seq_len=size["seq_len"],
        device=device,
        fit=fit,
        sequential=not teacher_forced,
        correct_residual=chosen.get("correct_residual", defaults.correct_residual),
        workers=chosen.get("workers", defaults.workers),
    )


def given_flag(key: str, value: Any) -> str:
    """The flag that gave `value` to `key`: the negative form of an on/off pair where it was off."""
    negative = {"teacher_forced": "--calibrate-sequential", "pass_through": "--calibrate-keep-init"}
    return negative[key] if value is False and key in negative else flag(key)


@dataclass
class Calibrated:
    """What `calibrate_student` returns: the fitted mixer tensors (float32, full names) and the record per layer."""

    tensors: dict[str, torch.Tensor]
    layers: list[LayerFit]
    tokens: int
    options: CalibrateOptions
    workers: int = 1  # processes that fitted the layers

    def record(self) -> dict[str, Any]:
        """The report's `calibration` entry (upcycle.json)."""
        o = self.options
        return {"data": o.data, "tokens": self.tokens, "sequences": o.samples, "seq_len": o.seq_len,
                "steps": o.fit.steps, "lr": o.fit.lr, "batch": o.fit.batch, "gates": o.fit.gates,
                "schedule": o.fit.schedule, "output_lstsq": o.fit.output_lstsq, "pass_through": o.fit.pass_through, "sequential": o.sequential,
                "workers": self.workers, "correct_residual": o.correct_residual, "layers": [asdict(f) for f in self.layers]}  # fmt: skip


def calibrate_student(
    teacher: Teacher,
    config: Any,
    source: TensorSource,
    options: CalibrateOptions,
    on_progress: Callable[[float, float | None, str], None] | None = None,
) -> Calibrated:
    """Fit every mixer of the student (`config`: its ZebraConfig; `source`: its upcycled tensors, full names) to
    the teacher's attention on `options.data`.

    Args:
        teacher: the opened teacher (`zebra.upcycle.open_teacher`).
        config: the student's ZebraConfig: one mixer/MLP pair per teacher layer.
        source: the student's tensors as upcycled (`UpcycledSource`); read, not changed.
        options: the data, its size, the device and the fit (`FitOptions`).
        on_progress: called as (steps done, total steps, note) while fitting.

    Returns:
        `Calibrated`: the fitted tensors of every mixer (float32) and each layer's errors before and after.

    Raises:
        ZebraError: data in another tokenizer, or fewer than `seq_len` tokens.
    """
    import torch

    from zebra.core.device import resolve_device
    from zebra.upcycle.attention_records import record_attention
    from zebra.upcycle.calibration import calibration_tokens

    tokens = calibration_tokens(options.data, teacher.tokenizer, teacher.shape.vocab_size,
                                options.samples, options.seq_len)  # fmt: skip  # [S, T]
    mixers = [i for i, char in enumerate(config.layer_pattern) if char != MLP]  # sublayer indices
    keep_stream = options.sequential and options.correct_residual > 0
    records = record_attention(teacher, tokens, [i // 2 for i in mixers], device=options.device,
                               keep_stream=keep_stream)  # fmt: skip
    dev = torch.device(resolve_device(options.device))
    total = len(mixers) * options.fit.steps

    done = [0] * len(mixers)  # fit steps taken per layer (the layers may be fitted side by side)

    def on_step(n: int, step: int, error: float) -> None:
        done[n] = step
        if on_progress is not None:
            index = mixers[n]
            kind = mixer_spec(config.layer_pattern[index]).label
            on_progress(sum(done), total, f"layer {index // 2} {kind}: error {error:.3f}")

    if options.sequential:
        from zebra.upcycle.sequential import calibrate_sequential

        tensors, layers = calibrate_sequential(config, source, tokens, records, options, dev, on_step)
        return Calibrated(tensors, layers, int(tokens.numel()), options)
    from zebra.upcycle.fit_workers import fit_layers, resolve_workers

    workers = resolve_workers(options.workers, options.device, len(mixers))
    states = {index: _mixer_state(source, index) for index in mixers}
    tensors, layers = fit_layers(
        config, mixers, states, records, options.fit, options.device, workers, on_step
    )
    return Calibrated(tensors, layers, int(tokens.numel()), options, workers)


def _mixer_state(source: TensorSource, index: int) -> dict[str, torch.Tensor]:
    """Mixer sublayer `index`'s upcycled tensors (float32, names within the mixer)."""
    prefix = f"model.layers.{index}.mixer."
    return {n[len(prefix) :]: source.get(n).float() for n in source.shapes() if n.startswith(prefix)}


class CalibratedSource(TensorSource):
    """The upcycled student's tensors with the calibrated ones in place of its mixers' (same names, shapes and
    dtype); each replaced tensor's origin says how it started and that it was fitted."""

    def __init__(self, upcycled: Any, calibrated: Calibrated):
        self.upcycled, self.calibrated = upcycled, calibrated
        self.origin = upcycled.origin
        self.origins: dict[str, TensorOrigin] = upcycled.origins

    def shapes(self):
        return self.upcycled.shapes()

    def get(self, name: str) -> torch.Tensor:
        tensor = self.upcycled.get(name)  # records the upcycled origin
        fitted = self.calibrated.tensors.get(name)
        if fitted is None:
            return tensor
        was = self.origins[name]
        detail = f"started {was.how}" + (f" ({was.detail})" if was.detail else "")
        self.origins[name] = TensorOrigin(
            name, was.shape, FITTED, was.source, f"{detail}; fitted to the teacher attention's output"
        )
        return fitted.to(tensor.dtype)

    def close(self) -> None:
        self.upcycled.close()
