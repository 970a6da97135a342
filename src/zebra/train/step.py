"""One optimizer step, shared by the trainer and `zebra bench train`.

The loss of a step is the mean next-token cross-entropy over every unmasked token of the global batch: each
micro-batch contributes `sum(CE) * ranks / tokens_in_global_batch` to backward, so gradient accumulation and
any number of ranks (whose gradients DDP / FSDP average) give the gradient of that one mean.

How a micro-batch's summed CE is computed is a strategy (`MicroBatchLoss`) fixed when the step is built:
- `zebra_loss_sum` (ZebraForCausalLM): the model computes it itself from `shift_labels` in its forward, with the
  chunked linear cross-entropy (`zebra_kernels.linear_cross_entropy`): the `[m, T, V]` logits never exist;
- `logits_loss_sum` (any other causal LM): the `[m, T, V]` logits, then `loss_sum` in float32;
- `zebra.train.distill.DistillLoss`: the distillation objective against a teacher, which also reports sums of
  its parts (`metric_names`: KL, student CE, teacher CE); the step returns their means per token.
All call the wrapped model itself, so FSDP2 / DDP hooks fire as usual.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zebra.train.dist import DistEnv, all_reduce_sum
from zebra.train.optim import GraphedOptimizerStep

if TYPE_CHECKING:
    import torch


@dataclass
class StepResult:
    loss: float  # mean CE over the global batch (every rank holds the same value)
    grad_norm: float  # total gradient norm before clipping
    tokens: int  # unmasked tokens in the global batch
    applied: bool  # False when the step was skipped for a non-finite loss or gradient
    flags: list[float]  # the `flags` passed to the step, summed over ranks
    metrics: dict[str, float] = field(default_factory=dict)  # the loss's reported parts, mean per token


def loss_sum(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy in fp32. logits [B, T, V]; labels, loss_mask [B, T]."""
    import torch.nn.functional as F

    labels = labels.masked_fill(loss_mask == 0, -100)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum")


# (model, tokens, labels, loss_mask) -> summed loss of the micro-batch, float32 scalar (or, for a loss with a
# `metric_names` attribute, (that scalar, [len(metric_names)] sums of its parts)); tokens, labels, loss_mask
# [m, T] with labels[:, t] the target of position t
MicroBatchLoss = Callable[["torch.nn.Module", "torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def logits_loss_sum(
    model: torch.nn.Module, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Any causal LM: its `[m, T, V]` logits, then `loss_sum`."""
    logits = model(input_ids=tokens, use_cache=False).logits  # [m, T, V]
    return loss_sum(logits, labels, loss_mask)


def zebra_loss_sum(
    model: torch.nn.Module, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """ZebraForCausalLM in training mode: the model's own chunked linear cross-entropy against the aligned
    targets (`shift_labels`, -100 where loss_mask is 0), summed (`num_items_in_batch=1`); no logits."""
    targets = labels.masked_fill(loss_mask == 0, -100)  # [m, T]
    return model(input_ids=tokens, shift_labels=targets, num_items_in_batch=1, use_cache=False).loss


def micro_batch_loss(model: torch.nn.Module) -> MicroBatchLoss:
    """The loss strategy for `model` (wrapped or not): `zebra_loss_sum` for a ZebraForCausalLM, else
    `logits_loss_sum`."""
    import torch

    from zebra.models import ZebraForCausalLM

    # DDP keeps the model in .module, torch.compile in ._orig_mod; FSDP2 keeps the class (a subclass of it)
    while isinstance(inner := getattr(model, "module", getattr(model, "_orig_mod", None)), torch.nn.Module):
        model = inner
    return zebra_loss_sum if isinstance(model, ZebraForCausalLM) else logits_loss_sum


class TrainStep:
    """Forward/backward over a step's micro-batches, gradient clipping, the non-finite check, optimizer step.

    Args:
        model: the (wrapped) model, called by `loss_fn`.
        autocast_bf16: run forward in bf16 autocast (DDP / single device; FSDP2 casts its own parameters).
        clip_grad: max gradient norm (0 = no clipping; the norm is still measured).
        loss_fn: how a micro-batch's summed CE is computed (default: `micro_batch_loss(model)`).
        optimizer_graph: replay the optimizer's step from a CUDA graph (`GraphedOptimizerStep`; the optimizer
            must be capturable); gradients are then zeroed in place instead of freed.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        env: DistEnv,
        *,
        autocast_bf16: bool,
        clip_grad: float,
        loss_fn: MicroBatchLoss | None = None,
        optimizer_graph: bool = False,
    ):
        self.model, self.optimizer, self.scheduler, self.env = model, optimizer, scheduler, env
        self.optimizer_step = GraphedOptimizerStep(optimizer) if optimizer_graph else optimizer.step
        self.keep_grads = optimizer_graph  # the graph reads the gradients where the first step found them
        self.loss_fn = loss_fn if loss_fn is not None else micro_batch_loss(model)
        self.autocast_bf16 = autocast_bf16
        self.clip_grad = clip_grad
        self.params = [p for p in model.parameters() if p.requires_grad]

    def autocast(self):
        import torch

        if not self.autocast_bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=torch.bfloat16)

    def _no_sync(self, last: bool):
        """DDP: all-reduce gradients only on the last micro-batch of a step."""
        if last or not hasattr(self.model, "no_sync"):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def __call__(
        self, micro_batches: list[dict[str, torch.Tensor]], *, flags: tuple[float, ...] = ()
    ) -> StepResult:
        """Run one step over this rank's `micro_batches` (each `tokens`, `labels`, `loss_mask` [m, T]).

        `flags` are summed over ranks with the loss (one collective). A non-finite loss or gradient norm
        skips the optimizer update (`applied=False`); the learning-rate schedule advances either way.
        """
        import torch

        dev = self.env.device
        local_tokens = sum(int(b["loss_mask"].sum()) for b in micro_batches)  # host tensors: no device sync
        total = float(local_tokens)
        if (
            self.env.distributed
        ):  # one device needs no collective, and no sync that would wait for the last step
            total = all_reduce_sum(torch.tensor([total], device=dev), self.env).item()
        scale = self.env.world_size / max(total, 1.0)
        names = tuple(getattr(self.loss_fn, "metric_names", ()))
        loss_acc = torch.zeros(1 + len(names), device=dev)  # [loss, *metric sums]
        for i, batch in enumerate(micro_batches):
            tokens = batch["tokens"].to(dev, non_blocking=True)  # [m, T]
            labels = batch["labels"].to(dev, non_blocking=True)  # [m, T]
            mask = batch["loss_mask"].to(dev, non_blocking=True)  # [m, T]
            with self._no_sync(i == len(micro_batches) - 1):
                with self.autocast():
                    out = self.loss_fn(self.model, tokens, labels, mask)  # summed loss, float32
                loss, parts = out if names else (out, loss_acc.new_zeros(0))
                (loss * scale).backward()
            loss_acc += torch.cat([loss.detach().reshape(1), parts.detach().to(loss_acc.dtype)])
        stats = all_reduce_sum(
            torch.cat([loss_acc, torch.tensor([float(f) for f in flags], device=dev)]), self.env
        )
        norm = torch.nn.utils.clip_grad_norm_(
            self.params, self.clip_grad if self.clip_grad > 0 else math.inf, foreach=dev.type != "cpu"
        )
        if hasattr(norm, "full_tensor"):  # FSDP2: a replicated DTensor
            norm = norm.full_tensor()
        stats = torch.cat([stats, norm.reshape(1).float()]).tolist()  # one device -> host sync per step
        count = max(total, 1.0)
        loss, grad_norm = stats[0] / count, stats[-1]
        metrics = {name: v / count for name, v in zip(names, stats[1 : 1 + len(names)], strict=True)}
        applied = math.isfinite(loss) and math.isfinite(grad_norm)
        if applied:
            self.optimizer_step()
        self.optimizer.zero_grad(set_to_none=not self.keep_grads)
        if self.scheduler is not None:
            self.scheduler.step()
        return StepResult(
            loss=loss,
            grad_norm=grad_norm,
            tokens=int(total),
            applied=applied,
            flags=stats[1 + len(names) : -1],
            metrics=metrics,
        )
