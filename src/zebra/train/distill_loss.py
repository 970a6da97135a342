"""The distillation loss of a linear head without the student's `[N, V]` logits: `linear_distill_loss`.

Per counted token (label != -100), with student logits z_s = h W^T, teacher logits z_t and temperature tau:

    p_t = softmax(z_t / tau),  q_s = softmax(z_s / tau)
    KL  = sum_v p_t (log p_t - log q_s)                         (forward KL, summed over the vocabulary)
    objective = kl_weight * tau^2 * KL + ce_weight * CE(z_s, label)

tau^2 is Hinton's scaling: the KL's gradient w.r.t. z_s is (q_s - p_t) / tau, so tau^2 keeps its size
independent of the temperature (at tau = 1, the published setting, it is 1). The objective is summed over the
counted tokens (the trainer divides by their number), as the chunked CE is.

The rows are processed `chunk_size` at a time, as `zebra_kernels.linear_cross_entropy` does: each chunk's student
logits in the matmul dtype (bf16 under autocast), its float32 log-softmaxes and KL, and right away the gradient
w.r.t. the logits, turned into that chunk's rows of d_hidden and added into d_weight. So the student's logits
never exist for all tokens, and neither model's logits exist in float32 for more than one chunk. Backward only
scales the stored gradients, so the loss must be backpropagated once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zebra_kernels._common import compute_dtype
from zebra_kernels.loss import matmul_dtype

METRICS = ("kl", "ce", "teacher_ce")  # the sums `linear_distill_loss` reports, in this order


@dataclass(frozen=True)
class DistillWeights:
    """How the objective mixes its terms (the recipe's `distill` section)."""

    kl_weight: float = 1.0
    ce_weight: float = 0.0
    temperature: float = 1.0


# rows per chunk: about chunk_size x V x (4 float32 buffers + the bf16 logits) of extra memory, 0.9 GB at
# V = 49152 (SmolLM2) and 2.3 GB at V = 128256 (Llama 3)
CHUNK_SIZE = 1024


def _chunk(
    zs: torch.Tensor, zt: torch.Tensor, labels: torch.Tensor, w: DistillWeights, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk: (objective sum, [kl, ce, teacher_ce] sums, d objective / d zs or None).

    zs, zt: `[C, V]` student / teacher logits in the accumulation dtype; labels `[C]` (-100: not counted).
    """
    valid = labels != -100  # [C]
    keep = valid.to(zs.dtype)[:, None]  # [C, 1]
    safe = torch.where(valid, labels, 0)[:, None]  # [C, 1]
    tau = w.temperature
    log_q = torch.log_softmax(zs / tau, dim=-1)  # [C, V]
    log_p = torch.log_softmax(zt / tau, dim=-1)  # [C, V]
    p = log_p.exp()
    kl = ((p * (log_p - log_q)).sum(-1, keepdim=True) * keep).sum()
    lse_s = zs.logsumexp(-1, keepdim=True)  # [C, 1]
    ce = ((lse_s - zs.gather(1, safe)) * keep).sum()
    teacher_ce = ((zt.logsumexp(-1, keepdim=True) - zt.gather(1, safe)) * keep).sum()
    objective = w.kl_weight * tau * tau * kl + w.ce_weight * ce
    sums = torch.stack([kl, ce, teacher_ce])
    if not need_grad:
        return objective, sums, None
    grad = log_q.exp_().sub_(p).mul_(w.kl_weight * tau)  # tau^2 * (q - p) / tau
    if w.ce_weight:
        soft = (zs - lse_s).exp_()
        soft.scatter_add_(1, safe, -torch.ones_like(safe, dtype=zs.dtype))
        grad.add_(soft, alpha=w.ce_weight)
    return objective, sums, grad.mul_(keep)


class _LinearDistill(torch.autograd.Function):
    """Gradients computed in forward, chunk by chunk, and kept; backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, teacher_logits, labels, weights, chunk_size, mm_dtype, grad_mode):
        need_h, need_w = grad_mode and ctx.needs_input_grad[0], grad_mode and ctx.needs_input_grad[1]
        acc = compute_dtype(hidden, weight)
        N = hidden.shape[0]
        w = weight.to(mm_dtype)  # [V, D], cast once
        d_hidden = torch.empty_like(hidden) if need_h else None  # [N, D]
        d_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None  # [V, D]
        objective = torch.zeros((), dtype=acc, device=hidden.device)
        sums = torch.zeros(len(METRICS), dtype=acc, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, N, chunk_size):
                rows = slice(start, min(start + chunk_size, N))
                h = hidden[rows].to(mm_dtype)  # [C, D]
                zs = (h @ w.T).to(acc)  # [C, V]
                zt = teacher_logits[rows].to(acc)  # [C, V]
                part, part_sums, grad = _chunk(zs, zt, labels[rows], weights, need_h or need_w)
                objective += part
                sums += part_sums
                if grad is None:
                    continue
                grad = grad.to(mm_dtype)
                if d_hidden is not None:
                    d_hidden[rows] = grad @ w  # [C, D]
                if d_weight is not None:
                    d_weight += grad.T @ h  # [V, D], summed in float32 (float64)
        ctx.d_hidden, ctx.d_weight, ctx.weight_dtype = d_hidden, d_weight, weight.dtype
        ctx.mark_non_differentiable(sums)
        return objective, sums

    @staticmethod
    def backward(ctx, grad_objective, _grad_sums):
        d_hidden = None if ctx.d_hidden is None else ctx.d_hidden * grad_objective.to(ctx.d_hidden.dtype)
        d_weight = None if ctx.d_weight is None else (ctx.d_weight * grad_objective).to(ctx.weight_dtype)
        return d_hidden, d_weight, None, None, None, None, None, None


def linear_distill_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    weights: DistillWeights = DistillWeights(),
    *,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The distillation objective of the student `hidden @ weight.T` against `teacher_logits`, summed over the
    counted tokens, and the sums of KL, student CE and teacher CE over them (`METRICS`, no gradient).

    Args:
        hidden: `[N, D]` the student's final hidden states.
        weight: `[V, D]` the student's output head.
        teacher_logits: `[N, V]` the teacher's logits of the same tokens (any float dtype; no gradient).
        labels: `[N]` the next tokens, -100 where a token does not count (no KL, no CE).
        weights: kl_weight, ce_weight and temperature.
        chunk_size: rows per chunk (default `CHUNK_SIZE`).

    Returns:
        (objective float32 scalar (float64 for float64 inputs), sums `[3]` in the same dtype).
    """
    N, D = hidden.shape
    if tuple(weight.shape[1:]) != (D,) or tuple(teacher_logits.shape) != (N, weight.shape[0]):
        raise ValueError(
            f"linear_distill_loss: hidden {list(hidden.shape)}, weight {list(weight.shape)} and teacher logits "
            f"{list(teacher_logits.shape)} do not match (expected [N, D], [V, D], [N, V])"
        )
    return _LinearDistill.apply(
        hidden,
        weight,
        teacher_logits.detach(),
        labels.to(hidden.device, torch.long),
        weights,
        chunk_size or CHUNK_SIZE,
        matmul_dtype(hidden, weight),
        torch.is_grad_enabled(),
    )
