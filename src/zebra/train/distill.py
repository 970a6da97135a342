"""The micro-batch loss of a distillation run (a `MicroBatchLoss` for `TrainStep`): the teacher's logits of the
micro-batch (no gradient), then the student's forward with `head_loss`, which computes
`zebra.train.distill_loss.linear_distill_loss` from the student's final hidden states and its head inside the
forward (where FSDP2 has gathered the head and DDP's hooks see it). The teacher's logits exist once, in bf16 on a
GPU; the student's only per chunk.
"""

from __future__ import annotations

import torch

from zebra.train.distill_loss import METRICS, DistillWeights, linear_distill_loss

__all__ = ["DistillLoss", "DistillWeights"]


class DistillLoss:
    """(summed objective, [KL, student CE, teacher CE] sums) of a micro-batch; see `zebra.train.distill_loss`."""

    metric_names = METRICS

    def __init__(self, teacher: torch.nn.Module, weights: DistillWeights, *, chunk_size: int | None = None):
        self.teacher, self.weights, self.chunk_size = teacher, weights, chunk_size

    def __call__(
        self, model: torch.nn.Module, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        targets = labels.masked_fill(loss_mask == 0, -100).flatten()  # [m*T]
        with torch.no_grad():
            teacher_logits = self.teacher(input_ids=tokens, use_cache=False).logits  # [m, T, V]
        parts: list[torch.Tensor] = []

        def head_loss(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            objective, sums = linear_distill_loss(
                hidden.flatten(0, 1),  # [m*T, D]
                weight,  # [V, D]
                teacher_logits.flatten(0, 1),  # [m*T, V]
                targets,
                self.weights,
                chunk_size=self.chunk_size,
            )
            parts.append(sums)
            return objective

        objective = model(input_ids=tokens, use_cache=False, head_loss=head_loss).loss
        return objective, parts[0]
