"""AdamW with decoupled parameter groups and the warm-up + decay learning-rate schedule.

Weight decay applies to matrices only: norms, biases and the recurrent mixers' `A_log`, `dt_bias` and `D`
(decay rates, time-step biases and skip gains, not weights) are never decayed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import torch

    from zebra.recipes import TrainSpec
    from zebra.recipes.schema import DistillSpec

NO_DECAY_NAMES = frozenset({"A_log", "dt_bias", "D", "bias"})


def decays(name: str, param: torch.Tensor) -> bool:
    """True when parameter `name` gets weight decay: a matrix that is not a norm weight."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in NO_DECAY_NAMES or param.ndim < 2:
        return False
    owner = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    return "norm" not in owner


def param_groups(
    model: torch.nn.Module, weight_decay: float, mixers: frozenset[int] | None = None
) -> list[dict]:
    """AdamW groups: matrices with `weight_decay`, everything else without (shared tensors counted once).

    With `mixers` (the new mixers' sublayers, `zebra.train.param_roles`), each of the two is split again into
    the new mixers' parameters and the copied ones (the group's `role`), so that their learning rates can differ.
    """
    from zebra.train.param_roles import role

    roles = (None,) if mixers is None else ("mixer", "copied")
    groups = {(r, d): [] for r in roles for d in (True, False)}
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        groups[(None if mixers is None else role(name, mixers), decays(name, p))].append(p)
    out = []
    for (r, decay), params in groups.items():
        if params or mixers is None:
            group = {"params": params, "weight_decay": weight_decay if decay else 0.0}
            out.append(group if r is None else {**group, "role": r})
    return out


def check_optimizer_graph(device_type: str) -> None:
    """`train.optimizer_graph` replays a CUDA graph: a ZebraError on any other device."""
    if device_type != "cuda":
        raise ZebraError(
            f"train.optimizer_graph needs a CUDA GPU (this run is on {device_type})",
            fix="--set train.optimizer_graph=false",
        )


def build_optimizer(
    model: torch.nn.Module, spec: TrainSpec, device: torch.device, mixers: frozenset[int] | None = None
) -> torch.optim.AdamW:
    """AdamW over `param_groups` (split by role with `mixers`); the fused CUDA implementation on GPUs,
    capturable (step counts on the GPU, no host reads) when `train.optimizer_graph` replays it from a CUDA graph
    (`GraphedOptimizerStep`)."""
    import torch

    if spec.optimizer_graph:
        check_optimizer_graph(device.type)
    return torch.optim.AdamW(
        param_groups(model, spec.weight_decay, mixers),
        lr=spec.lr,
        betas=(spec.adam_beta1, spec.adam_beta2),
        eps=spec.adam_eps,
        fused=device.type == "cuda",
        capturable=spec.optimizer_graph,
    )


class GraphedOptimizerStep:
    """`optimizer.step()` captured once in a CUDA graph, then replayed: one launch instead of the fused AdamW's
    per-group kernel launches and Python work.

    The first call runs eagerly (it allocates the moments; after a restore they exist already), the next captures.
    The learning rate stays a float in `param_groups` (the scheduler and checkpoints see no change); the graph reads
    it from a device tensor filled before each replay. Gradients must keep their storage between steps: zero
    them with `zero_grad(set_to_none=False)`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.graph: torch.cuda.CUDAGraph | None = None
        self.lrs: list[torch.Tensor] = []  # one per param group, read by the captured kernels

    def __call__(self) -> None:
        if self.graph is None:
            if not self.optimizer.state:
                self.optimizer.step()
                return
            self._capture()
        for group, lr in zip(self.optimizer.param_groups, self.lrs, strict=True):
            lr.fill_(group["lr"])
        self.graph.replay()

    def _capture(self) -> None:
        import torch

        groups = self.optimizer.param_groups
        device = groups[0]["params"][0].device
        floats = [group["lr"] for group in groups]
        self.lrs = [torch.tensor(float(lr), dtype=torch.float32, device=device) for lr in floats]
        for group, lr in zip(groups, self.lrs, strict=True):
            group["lr"] = lr
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):  # records the step; replay runs it
                self.optimizer.step()
        finally:
            for group, lr in zip(groups, floats, strict=True):
                group["lr"] = lr


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


def build_scheduler(
    optimizer: torch.optim.Optimizer, spec: TrainSpec, distill: DistillSpec | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR whose factor is `lr_at(step) / lr` (its state is the step count, saved in checkpoints).

    Groups of role `copied` (`param_groups` with mixers) get `distill.copied_lr_scale` times that, and 0 for the
    first `distill.mixer_only_steps` steps (the new mixers train alone; AdamW then leaves those weights as they
    are, weight decay included, since both scale with the learning rate)."""
    import torch

    def factor(step: int) -> float:
        return lr_at(step, spec) / spec.lr if spec.lr > 0 else 0.0

    def copied_factor(step: int) -> float:
        return 0.0 if step < distill.mixer_only_steps else distill.copied_lr_scale * factor(step)

    factors = [copied_factor if group.get("role") == "copied" else factor for group in optimizer.param_groups]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factors)
