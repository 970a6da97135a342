"""The micro-batch loss of a distillation run (a `MicroBatchLoss` for `TrainStep`): the teacher's logits of the
micro-batch (no gradient), then the student's forward with `head_loss`, which computes
`zebra.train.distill_loss.linear_distill_loss` from the student's final hidden states and its head inside the
forward (where FSDP2 has gathered the head and DDP's hooks see it). The teacher's logits exist once, in bf16 on a
GPU; the student's only per chunk. With `distill.top_k` the teacher enters as its top-k logits (`TopK`), which a
logit cache (`zebra.train.logit_cache`) can keep on disk and hand back.
"""

from __future__ import annotations

import torch

from zebra.train.distill_loss import METRICS, DistillWeights, TopK, linear_distill_loss, top_k_of
from zebra.train.logit_cache import LogitCache, sequence_keys

__all__ = ["DistillLoss", "DistillWeights"]


class DistillLoss:
    """(summed objective, [KL, student CE, teacher CE] sums) of a micro-batch; see `zebra.train.distill_loss`.

    With a `LogitCache` (`distill.logit_cache`, top-k only), a micro-batch whose sequences are all cached reads the
    teacher's `TopK` back instead of running the teacher; otherwise the teacher runs and its `TopK` is stored."""

    metric_names = METRICS

    def __init__(
        self,
        teacher: torch.nn.Module,
        weights: DistillWeights,
        *,
        chunk_size: int | None = None,
        cache: LogitCache | None = None,
    ):
        self.teacher, self.weights, self.chunk_size, self.cache = teacher, weights, chunk_size, cache

    def teacher_side(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | TopK:
        """The teacher's logits `[m*T, V]`, or their `TopK` (read from the cache, or cut and stored there)."""
        keys = sequence_keys(tokens, targets.view(tokens.shape)) if self.cache is not None else None
        if keys is not None and (top := self.cache.lookup(keys)) is not None:
            return TopK(*(t.to(tokens.device) for t in (top.indices, top.values, top.lse, top.label_logit)))
        with torch.no_grad():
            logits = self.teacher(input_ids=tokens, use_cache=False).logits.flatten(0, 1)  # [m*T, V]
        if keys is None:
            return logits
        top = top_k_of(logits, targets, self.weights.top_k)
        self.cache.store(keys, top)
        return top

    def __call__(
        self, model: torch.nn.Module, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        targets = labels.masked_fill(loss_mask == 0, -100).flatten()  # [m*T]
        teacher = self.teacher_side(tokens, targets)
        parts: list[torch.Tensor] = []

        def head_loss(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            objective, sums = linear_distill_loss(
                hidden.flatten(0, 1),  # [m*T, D]
                weight,  # [V, D]
                teacher,  # [m*T, V] or a TopK of m*T rows
                targets,
                self.weights,
                chunk_size=self.chunk_size,
            )
            parts.append(sums)
            return objective

        objective = model(input_ids=tokens, use_cache=False, head_loss=head_loss).loss
        return objective, parts[0]
