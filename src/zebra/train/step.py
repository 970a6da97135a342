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
from typing import TYPE_CHECKING

from zebra.train.dist import DistEnv, all_reduce_sum
from zebra.train.optim import GraphedOptimizerStep

if TYPE_CHECKING:
    import torch


class StepResult:
    """One step's figures. On a GPU they come to the host while the next step runs (`zebra.core.host_copy`: a copy
    queued behind the step): reading one waits for them, so a loop that reads each step's figures after queueing
    the next never lets the GPU's queue run dry.

    Attributes (read as floats): loss (mean CE over the global batch, the same on every rank), grad_norm (total
    gradient norm before clipping), applied (False when the step was skipped for a non-finite loss or gradient),
    flags (the `flags` passed to the step, summed over ranks), metrics (the loss's reported parts, mean per
    token); and tokens (unmasked tokens in the global batch, known at once).
    """

    def __init__(self, stats: torch.Tensor, *, tokens: float, names: tuple[str, ...]):
        from zebra.core.host_copy import HostCopy

        # [loss sum, *metric sums, *flags, grad norm], copied behind the step
        self._copy = HostCopy(tuple(stats.shape), stats.dtype, stats.device).start(stats)
        self._values: list[float] | None = None
        self._count = max(tokens, 1.0)
        self._names = names
        self.tokens = int(tokens)

    def wait(self) -> StepResult:
        """Wait until the figures are on the host (the step's backward is done); returns self."""
        self._read()
        return self

    def _read(self) -> list[float]:
        if self._values is None:
            self._values = self._copy.read()
        return self._values

    @property
    def loss(self) -> float:
        return self._read()[0] / self._count

    @property
    def grad_norm(self) -> float:
        return self._read()[-1]

    @property
    def applied(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)

    @property
    def metrics(self) -> dict[str, float]:
        values = self._read()[1 : 1 + len(self._names)]
        return {name: v / self._count for name, v in zip(self._names, values, strict=True)}

    @property
    def flags(self) -> list[float]:
        return self._read()[1 + len(self._names) : -1]


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


def is_sharded(param: torch.Tensor) -> bool:
    """An FSDP2 parameter (a DTensor)."""
    from torch.distributed.tensor import DTensor

    return isinstance(param, DTensor)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the GPU: copied from pinned memory (from pageable memory, a
    host-to-GPU copy first waits for every queued kernel)."""
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


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
        self.metric_names = tuple(getattr(self.loss_fn, "metric_names", ()))
        self.autocast_bf16 = autocast_bf16
        self.clip_grad = clip_grad
        self.params = [p for p in model.parameters() if p.requires_grad]
        # a fused AdamW (torch's, on GPUs) reads `found_inf` and skips its own update: the step needs no host read
        # (not measured with FSDP2's sharded parameters: those keep the host check)
        self.skip_on_device = (
            not optimizer_graph
            and all(g.get("fused") for g in optimizer.param_groups)
            and not any(is_sharded(p) for p in self.params)
        )

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

    def _clip_in_update(self) -> torch.Tensor:
        """The gradient norm, with the clipping left to the fused AdamW: it divides each gradient by
        `grad_scale` as it reads it (and writes it back), in place of `clip_grad_norm_`'s pass that reads and
        writes every gradient: 4 bytes per parameter less traffic. The same coefficient as `clip_grad_norm_`'s:
        max_norm / (norm + 1e-6), at most 1."""
        import torch

        norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if self.clip_grad > 0:
            self.optimizer.grad_scale = 1.0 / (self.clip_grad / (norm + 1e-6)).clamp(max=1.0)  # [] >= 1
        return norm

    def forward_backward(
        self, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch on the device (`[m, T]` each): its summed loss and parts (`[len(metric_names)]`),
        backward of loss * scale adding into the gradients."""
        with self.autocast():
            out = self.loss_fn(self.model, tokens, labels, loss_mask)  # summed loss, float32
        loss, parts = out if self.metric_names else (out, out.new_zeros(0))
        (loss * scale).backward()
        return loss.detach(), parts.detach()

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
        names = self.metric_names
        loss_acc = torch.zeros(1 + len(names), device=dev)  # [loss, *metric sums]
        for i, batch in enumerate(micro_batches):
            tokens, labels, mask = (
                to_device(batch[k], dev) for k in ("tokens", "labels", "loss_mask")
            )  # [m, T]
            with self._no_sync(i == len(micro_batches) - 1):
                loss, parts = self.forward_backward(tokens, labels, mask, scale)
            loss_acc += torch.cat([loss.reshape(1), parts.to(loss_acc.dtype)])
        stats = all_reduce_sum(
            torch.cat([loss_acc, to_device(torch.tensor([float(f) for f in flags]), dev)]), self.env
        )
        if self.skip_on_device:
            norm = self._clip_in_update()
        else:
            norm = torch.nn.utils.clip_grad_norm_(
                self.params, self.clip_grad if self.clip_grad > 0 else math.inf, foreach=dev.type != "cpu"
            )
        if hasattr(norm, "full_tensor"):  # FSDP2: a replicated DTensor
            norm = norm.full_tensor()
        stats = torch.cat([stats, norm.reshape(1).float()])  # [loss sum, *metric sums, *flags, grad norm]
        if self.skip_on_device:  # the fused update skips itself: no host read between backward and update
            finite = torch.isfinite(stats[0]) & torch.isfinite(stats[-1])  # []
            self.optimizer.found_inf = (~finite).float()  # 1.0: skip
        result = StepResult(stats, tokens=total, names=names)
        if self.skip_on_device or result.applied:  # `applied` waits for the figures
            self.optimizer_step()
        self.optimizer.zero_grad(set_to_none=not self.keep_grads)
        if self.scheduler is not None:
            self.scheduler.step()
        return result
