"""Calibration (`zebra upcycle TEACHER --calibrate DATA`): a student that starts close to its teacher.

On a few thousand tokens of DATA (in the teacher's tokenizer), before the export is written:

1. the teacher runs once; every layer's attention input, output and per-head distance / entropy are recorded
   (`zebra.upcycle.teacher_records`);
2. each recurrent mixer gets its decay (and beta) from its teacher heads, and each mixer a least-squares scale per
   head of its output projection (`zebra.upcycle.gates`);
3. each mixer, recurrent or MLA, is fitted on its own to its teacher layer's attention output, teacher-forced with
   the teacher's input to that layer (`zebra.upcycle.fit`); the layers are independent, so one pass over the
   recorded layers fits them all. MLPs, norms and embeddings are not touched.

`calibrate_student` is the library entry point (a pipeline stage calls it the same way); `CalibratedSource` puts
the fitted tensors into the export in place of the upcycled ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from zebra.convert.tensor_sources import TensorSource
from zebra.mixers import MLP, mixer_spec, resolve
from zebra.upcycle.fit import FitOptions
from zebra.upcycle.report import FITTED, TensorOrigin

if TYPE_CHECKING:
    import torch

    from zebra.upcycle.teacher import Teacher


@dataclass(frozen=True)
class CalibrateOptions:
    """The calibration text and how each mixer is fitted."""

    data: str  # a prepared folder or Megatron prefix in the teacher's tokenizer (as --calibration takes)
    samples: int = 16  # sequences
    seq_len: int = 128  # tokens per sequence
    device: str = "auto"  # where the teacher runs and the mixers are fitted
    fit: FitOptions = field(default_factory=FitOptions)


@dataclass
class LayerFit:
    """One mixer's calibration: its relative output error ||y_s - y_t|| / ||y_t|| on the calibration tokens as
    upcycled, after the gate init and value scale, and after the fit (the best weights)."""

    layer: int  # dense layer index
    mixer: str  # registry name
    error_upcycled: float
    error_init: float
    error_fit: float
    best_step: int
    gates: dict[str, list[float]] = field(default_factory=dict)  # decay, beta, value_scale per head


@dataclass
class Calibrated:
    """What `calibrate_student` returns: the fitted mixer tensors (float32, full names) and the record per layer."""

    tensors: dict[str, torch.Tensor]
    layers: list[LayerFit]
    tokens: int
    options: CalibrateOptions

    def record(self) -> dict[str, Any]:
        """The report's `calibration` entry (upcycle.json)."""
        o = self.options
        return {"data": o.data, "tokens": self.tokens, "sequences": o.samples, "seq_len": o.seq_len,
                "steps": o.fit.steps, "lr": o.fit.lr, "batch": o.fit.batch, "gates": o.fit.gates,
                "layers": [asdict(f) for f in self.layers]}  # fmt: skip


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

    from zebra.device import resolve_device
    from zebra.upcycle.calibration import calibration_tokens
    from zebra.upcycle.teacher_records import record_attention

    tokens = calibration_tokens(options.data, teacher.tokenizer, teacher.shape.vocab_size,
                                options.samples, options.seq_len)  # fmt: skip  # [S, T]
    mixers = [i for i, char in enumerate(config.layer_pattern) if char != MLP]  # sublayer indices
    records = record_attention(teacher, tokens, [i // 2 for i in mixers], device=options.device)
    dev = torch.device(resolve_device(options.device))
    total = len(mixers) * options.fit.steps
    tensors: dict[str, torch.Tensor] = {}
    layers: list[LayerFit] = []
    for n, index in enumerate(mixers):
        record = records.pop(index // 2)  # freed once fitted

        def on_step(step: int, error: float, n: int = n, index: int = index) -> None:
            if on_progress is not None:
                kind = mixer_spec(config.layer_pattern[index]).label
                on_progress(
                    n * options.fit.steps + step, total, f"layer {index // 2} {kind}: error {error:.3f}"
                )

        fitted, result = _calibrate_mixer(config, source, index, record, options.fit, dev, on_step)
        tensors.update(fitted)
        layers.append(result)
    return Calibrated(tensors, layers, int(tokens.numel()), options)


def _calibrate_mixer(
    config: Any, source: TensorSource, index: int, record: Any, fit: FitOptions, dev: Any, on_step: Callable
) -> tuple[dict[str, torch.Tensor], LayerFit]:
    """One mixer sublayer: built from the source's tensors, gates set, fitted. Returns its tensors and record."""
    import torch

    from zebra.models.modeling_zebra import ZebraSublayer
    from zebra.upcycle.fit import fit_mixer, head_outputs, relative_error
    from zebra.upcycle.gates import fit_value_scale

    prefix = f"model.layers.{index}.mixer."
    state = {n[len(prefix) :]: source.get(n).float() for n in source.shapes() if n.startswith(prefix)}
    mixer = ZebraSublayer(config, index).mixer.float()
    mixer.load_state_dict(state, strict=True)
    mixer.to(dev).eval()
    x, y = record.inputs.to(dev), record.outputs.to(dev)  # [S, T, D]
    spec = mixer_spec(config.layer_pattern[index])
    kind = spec.name
    upcycled = relative_error(mixer, x, y)
    gates: dict[str, list[float]] = {}
    if fit.gates:
        if spec.upcycle is not None and spec.upcycle.gates:  # the mixer's data-driven gate init
            gates = resolve(spec.upcycle.gates)(
                mixer, record.distance, record.entropy, x.flatten(0, 1).mean(dim=0)
            )
        heads = config.num_attention_heads if kind == "mla" else record.distance.numel()
        gates["value_scale"] = fit_value_scale(mixer, head_outputs(mixer, x, heads), y.flatten(0, 1))
    with torch.enable_grad():
        initial, best, best_step = fit_mixer(mixer, x, y, fit, on_step)
    fitted = {prefix + k: v.detach().cpu() for k, v in mixer.state_dict().items()}
    return fitted, LayerFit(index // 2, kind, upcycled, initial, best, best_step, gates)


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
