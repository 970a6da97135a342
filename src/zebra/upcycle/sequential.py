"""Sequential calibration: each mixer fitted on the student's own stream, the layers before it already fitted.

The teacher-forced fit (`zebra.upcycle.fit`, every layer on the teacher's input) leaves each layer's error to add
up over the depth: layer l of the student never sees the stream its own earlier layers make. Here the student
(embeddings, norms, MLPs as upcycled, mixers as fitted so far) runs once over the calibration sequences, sublayer
by sublayer; at each mixer sublayer the stream so far is normalised by the sublayer's own norm and the mixer is
fitted on that input, then the stream moves on with the fitted mixer and the teacher's MLP:

    input   x_s = norm_l(h_s)                       the student's stream h_s before sublayer l, [S, T, D]
    target  y_t + c (h_t - h_s)                     y_t: the teacher attention's output; h_t: the teacher's stream
                                                    before its layer; c = `correct_residual` in [0, 1]

With c = 0 the mixer learns the teacher's attention from what the student actually feeds it; with c = 1 it also
takes out the drift of the stream so far (the teacher's stream after the layer is the target of the sum). The
stream is kept whole, `[S, T, D]` float32 on the fit device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from zebra.upcycle.fit import LayerFit


def student_model(config: Any, source: Any, dev: Any) -> nn.Module:
    """The student of `config` with the source's tensors (float32, on `dev`, eval mode)."""
    import torch

    from zebra.models import ZebraForCausalLM

    model = ZebraForCausalLM(config).float()
    state = {n: source.get(n).float() for n in source.shapes()}
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model.to(dev).eval().requires_grad_(False).to(torch.float32)


def chunked(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """`fn` over `x [S, ...]` a few sequences at a time, without gradients."""
    import torch

    with torch.no_grad():
        return torch.cat([fn(x[i : i + batch]) for i in range(0, x.shape[0], batch)])


def calibrate_sequential(
    config: Any,
    source: Any,
    tokens: torch.Tensor,
    records: dict[int, Any],
    options: Any,
    dev: Any,
    on_step: Callable[[int, int, float], None],
) -> tuple[dict[str, torch.Tensor], list[LayerFit]]:
    """Fit every mixer of the student in order on its own stream (module docstring).

    Args:
        config, source: the student's ZebraConfig and upcycled tensors (full names).
        tokens: `[S, T]` the calibration sequences the teacher's `records` were made on.
        records: {teacher layer: LayerRecord} with `stream` kept when `options.correct_residual` > 0.
        options: the calibration's CalibrateOptions (its `fit`, `correct_residual`).
        dev: the fit device.
        on_step: called as (mixer number, step, error) after every fit step.

    Returns:
        (the fitted tensors of every mixer, float32 on the CPU, full names; each mixer's LayerFit).
    """
    from zebra.mixers import MLP
    from zebra.upcycle.fit import fit_layer, mixer_forward

    model = student_model(config, source, dev)
    stream = chunked(model.model.embeddings, tokens.to(dev)).float()  # [S, T, D]
    tensors: dict[str, torch.Tensor] = {}
    layers: list[LayerFit] = []
    for index, sub in enumerate(model.model.layers):
        normed = chunked(sub.norm, stream)  # [S, T, D]
        if sub.char != MLP:
            record = records.pop(index // 2)
            target = record.outputs.to(dev)
            if options.correct_residual:
                target = target + options.correct_residual * (record.stream.to(dev) - stream)
            sub.mixer.requires_grad_(True)
            n = len(layers)
            layers.append(fit_layer(sub.mixer, config, index, normed, target, record, options.fit,
                                    lambda step, error, n=n: on_step(n, step, error)))  # fmt: skip
            sub.mixer.requires_grad_(False)
            prefix = f"model.layers.{index}.mixer."
            tensors.update({prefix + k: v.detach().cpu() for k, v in sub.mixer.state_dict().items()})
        stream = stream + chunked(lambda x, sub=sub: mixer_forward(sub.mixer, x), normed)
    return tensors, layers
