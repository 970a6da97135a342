"""The per-layer fit: one new mixer, teacher-forced with the teacher's input to its layer, trained to reproduce
the teacher attention's output on the calibration sequences.

Loss: the relative squared error sum ||y_s - y_t||^2 / sum ||y_t||^2 over a minibatch of sequences; Adam over every
parameter of the mixer (its pre-norm, the MLPs and the embeddings are not part of it). The error on all the
calibration sequences, ||y_s - y_t|| / ||y_t|| (1.0: as far as a zero output), is measured before, every
`eval_every` steps and at the end; the weights with the lowest are kept.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn


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


@dataclass(frozen=True)
class FitOptions:
    """How each mixer is fitted."""

    steps: int = 50  # Adam steps per layer
    lr: float = 1e-3
    batch: int = 2  # sequences per step
    eval_every: int = 25  # steps between measurements of the error on all sequences (the best is kept)
    # sequences per forward of those measurements (a forward costs its launches, not its size)
    eval_batch: int = 16
    gates: bool = True  # the analytic gate init and value scale before the fit (zebra.upcycle.gates)
    seed: int = 0
    schedule: str = "constant"  # the LR over the steps: constant, or cosine (to lr / 20)
    output_lstsq: bool = False  # the whole output projection by least squares (ridge) before the Adam steps
    pass_through: bool = True  # with gates: identity short convs, a steady output gate (gates.pass_through)


def mixer_forward(mixer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The mixer on `x [B, T, D]` as a sublayer calls it (positions 0..T-1 for MLA's RoPE). Returns `[B, T, D]`."""
    import torch

    positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
    return mixer(x, position_ids=positions)


def relative_error(
    mixer: nn.Module, inputs: torch.Tensor, outputs: torch.Tensor, batch: int = FitOptions.eval_batch
) -> float:
    """||y_s - y_t|| / ||y_t|| over every sequence of `inputs`, `outputs` `[S, T, D]`, `batch` sequences a
    forward."""
    import torch

    diff, norm = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, inputs.shape[0], batch):
            y = outputs[i : i + batch]
            diff += float((mixer_forward(mixer, inputs[i : i + batch]) - y).pow(2).sum())
            norm += float(y.pow(2).sum())
    return (diff / max(norm, 1e-30)) ** 0.5


def head_outputs(mixer: nn.Module, inputs: torch.Tensor, heads: int, batch: int = 4) -> torch.Tensor:
    """What enters the mixer's output projection on `inputs [S, T, D]`, per head: `[S * T, H, Dv]`."""
    import torch

    from zebra.upcycle.gates import output_projection

    kept: list[torch.Tensor] = []
    handle = output_projection(mixer).register_forward_pre_hook(lambda m, args: kept.append(args[0].detach()))
    try:
        with torch.no_grad():
            for i in range(0, inputs.shape[0], batch):
                mixer_forward(mixer, inputs[i : i + batch])
    finally:
        handle.remove()
    flat = torch.cat(kept).flatten(0, 1)  # [S * T, H * Dv]
    return flat.view(flat.shape[0], heads, -1)


def fit_mixer(
    mixer: nn.Module,
    inputs: torch.Tensor,
    outputs: torch.Tensor,
    options: FitOptions,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[float, float, int]:
    """Fit `mixer` (float32, in place) to map `inputs` to `outputs` (`[S, T, D]`); keeps the best weights.

    Returns (error before, best error, the step it was reached at: 0 = the start was best); `on_step(step, error)`
    after every step with the last measured error.
    """
    import torch

    generator = torch.Generator().manual_seed(options.seed)
    optimizer = torch.optim.Adam([p for p in mixer.parameters() if p.requires_grad], lr=options.lr)
    scheduler = None
    if options.schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, max(1, options.steps), options.lr / 20
        )
    start = best = relative_error(mixer, inputs, outputs, options.eval_batch)
    best_state, best_step, last = copy.deepcopy(mixer.state_dict()), 0, start
    mixer.train()
    for step in range(1, options.steps + 1):
        pick = torch.randperm(inputs.shape[0], generator=generator)[: options.batch]
        x, y = inputs[pick], outputs[pick]
        loss = (mixer_forward(mixer, x) - y).pow(2).sum() / y.pow(2).sum().clamp(min=1e-30)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if step % options.eval_every == 0 or step == options.steps:
            last = relative_error(mixer, inputs, outputs, options.eval_batch)
            if last < best:
                best, best_step, best_state = last, step, copy.deepcopy(mixer.state_dict())
        if on_step is not None:
            on_step(step, last)
    mixer.load_state_dict(best_state)
    mixer.eval()
    return start, best, best_step


def fit_output_projection(
    mixer: nn.Module, features: torch.Tensor, target: torch.Tensor, ridge: float = 1e-3
) -> None:
    """Set the mixer's output projection W `[D, F]` to the ridge least-squares map of `features [N, F]` (what
    enters it) to `target [N, D]`: W = Y^T C (C^T C + ridge * mean(diag) I)^-1."""
    import torch

    from zebra.upcycle.gates import output_projection

    c = features.double()
    gram = c.T @ c  # [F, F]
    gram += ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    w = torch.linalg.solve(gram, c.T @ target.double()).T  # [D, F]
    proj = output_projection(mixer)
    with torch.no_grad():
        proj.weight.copy_(w.to(proj.weight.dtype))


def fit_layer(
    mixer: Any, config: Any, index: int, x: Any, y: Any, record: Any, fit: FitOptions, on_step: Callable
) -> LayerFit:
    """Set the gates and value scale of mixer sublayer `index` and fit it (in place) to map `x` to `y`
    (`[S, T, D]`); `record` gives the teacher heads' distance and entropy. Returns its LayerFit."""
    import torch

    from zebra.mixers import mixer_spec, resolve
    from zebra.upcycle.gates import fit_value_scale, pass_through

    spec = mixer_spec(config.layer_pattern[index])
    kind = spec.name
    upcycled = relative_error(mixer, x, y, fit.eval_batch)
    gates: dict[str, list[float]] = {}
    if fit.gates:
        mean_input = x.flatten(0, 1).mean(dim=0)  # [D]
        if fit.pass_through:
            pass_through(mixer, mean_input)
        if spec.upcycle is not None and spec.upcycle.gates:  # the mixer's data-driven gate init
            gates = resolve(spec.upcycle.gates)(mixer, record.distance, record.entropy, mean_input)
        heads = config.num_attention_heads if kind == "mla" else record.distance.numel()
        gates["value_scale"] = fit_value_scale(mixer, head_outputs(mixer, x, heads), y.flatten(0, 1))
    if fit.output_lstsq:
        fit_output_projection(mixer, head_outputs(mixer, x, 1).flatten(1), y.flatten(0, 1))
    with torch.enable_grad():
        initial, best, best_step = fit_mixer(mixer, x, y, fit, on_step)
    return LayerFit(index // 2, kind, upcycled, initial, best, best_step, gates)
