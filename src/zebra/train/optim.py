"""AdamW with decoupled parameter groups and the warm-up + decay learning-rate schedule.

Weight decay applies to matrices only: norms, biases and the recurrent mixers' `A_log`, `dt_bias` and `D`
(decay rates, time-step biases and skip gains, not weights) are never decayed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from zebra.recipes import TrainSpec

NO_DECAY_NAMES = frozenset({"A_log", "dt_bias", "D", "bias"})


def decays(name: str, param: torch.Tensor) -> bool:
    """True when parameter `name` gets weight decay: a matrix that is not a norm weight."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in NO_DECAY_NAMES or param.ndim < 2:
        return False
    owner = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    return "norm" not in owner


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices with `weight_decay`, everything else without (shared tensors counted once)."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if decays(name, p) else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: torch.nn.Module, spec: TrainSpec, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `param_groups`; the fused CUDA implementation on GPUs."""
    import torch

    return torch.optim.AdamW(
        param_groups(model, spec.weight_decay),
        lr=spec.lr,
        betas=(spec.adam_beta1, spec.adam_beta2),
        eps=spec.adam_eps,
        fused=device.type == "cuda",
    )


def lr_at(step: int, spec: TrainSpec) -> float:
    """The learning rate of optimizer step `step` (0-based).

    Linear warm-up from lr/warmup to lr over `warmup_steps`, then `lr_decay_style` from lr down to `min_lr`
    at `max_steps` (cosine: min + (lr - min) * (1 + cos(pi * progress)) / 2; linear; or constant lr).
    """
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    if spec.lr_decay_style == "constant":
        return spec.lr
    span = max(1, spec.max_steps - spec.warmup_steps)
    progress = min(1.0, (step - spec.warmup_steps) / span)
    if spec.lr_decay_style == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return spec.min_lr + (spec.lr - spec.min_lr) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, spec: TrainSpec) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR whose factor is `lr_at(step) / lr` (its state is the step count, saved in checkpoints)."""
    import torch

    def factor(step: int) -> float:
        return lr_at(step, spec) / spec.lr if spec.lr > 0 else 0.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
