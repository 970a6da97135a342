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

Top-k (`DistillWeights.top_k`, `distill.top_k`): the teacher's distribution is kept on its k most likely tokens K
and one bucket for the rest of its mass, p_rest = 1 - sum_K p_t; the student's is read on the same partition:

    KL_k = sum_{v in K} p_v (log p_v - log q_v) + p_rest (log p_rest - log q_rest),   q_rest = sum_{v not in K} q_v

Its gradient w.r.t. z_s is q - target, target = p_v on K and p_rest * q_v / q_rest elsewhere (the rest of the
mass spread as the student spreads it). The teacher enters only through `TopK` (its top-k logits and indices, the
log-sum-exp of all its logits, its logit of the label), which is what a logit cache keeps
(`zebra.train.logit_cache`); full teacher logits are cut to it chunk by chunk, so a cached and an uncached run
compute the same loss. At k = V it is the full KL. Taken at temperature 1 only.
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
    top_k: int = 0  # 0: the KL over the whole vocabulary; k: over the teacher's top k and a rest bucket


@dataclass(frozen=True)
class TopK:
    """What the top-k KL needs of the teacher, per token: `indices` `[N, k]` (long) and `values` `[N, k]` of its
    k largest logits, `lse` `[N]` the log-sum-exp of all its logits, `label_logit` `[N]` its logit of the label
    (0 where the label is -100)."""

    indices: torch.Tensor
    values: torch.Tensor
    lse: torch.Tensor
    label_logit: torch.Tensor

    def __getitem__(self, rows: slice) -> TopK:
        return TopK(self.indices[rows], self.values[rows], self.lse[rows], self.label_logit[rows])

    def __len__(self) -> int:
        return self.indices.shape[0]


def top_k_of(logits: torch.Tensor, labels: torch.Tensor, k: int) -> TopK:
    """The `TopK` of teacher `logits` `[N, V]` for `labels` `[N]`, in float32 (float64 for float64 logits)."""
    z = logits if logits.dtype == torch.float64 else logits.float()
    values, indices = z.topk(k, dim=-1)  # [N, k]
    label_logit = z.gather(1, torch.where(labels != -100, labels, 0)[:, None])[:, 0]  # [N]
    return TopK(indices, values, z.logsumexp(-1), label_logit)


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


def _chunk_top_k(
    zs: torch.Tensor, top: TopK, labels: torch.Tensor, w: DistillWeights, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`_chunk` for the top-k KL: the teacher as a `TopK` of the chunk's `C` rows (temperature 1)."""
    valid = labels != -100  # [C]
    keep = valid.to(zs.dtype)[:, None]  # [C, 1]
    safe = torch.where(valid, labels, 0)[:, None]  # [C, 1]
    idx = top.indices.to(zs.device, torch.long)  # [C, k]
    log_p = top.values.to(zs.dtype) - top.lse.to(zs.dtype)[:, None]  # [C, k]
    p = log_p.exp()
    p_rest = (1.0 - p.sum(-1, keepdim=True)).clamp_(min=0.0)  # [C, 1]
    log_q = torch.log_softmax(zs, dim=-1)  # [C, V]
    log_q_k = log_q.gather(1, idx)  # [C, k]
    outside = log_q.scatter(1, idx, float("-inf"))  # [C, V] log q off the teacher's top k
    log_q_rest = outside.logsumexp(-1, keepdim=True)  # [C, 1]
    # q_rest floored at e^-100: at k = V (nothing outside) p_rest is 0 up to rounding and adds nothing
    rest = torch.xlogy(p_rest, p_rest) - p_rest * log_q_rest.clamp(min=-100.0)
    kl = (((p * (log_p - log_q_k)).sum(-1, keepdim=True) + rest) * keep).sum()
    lse_s = zs.logsumexp(-1, keepdim=True)  # [C, 1]
    ce = ((lse_s - zs.gather(1, safe)) * keep).sum()
    teacher_ce = ((top.lse - top.label_logit).to(zs.dtype)[:, None] * keep).sum()
    objective = w.kl_weight * kl + w.ce_weight * ce
    sums = torch.stack([kl, ce, teacher_ce])
    if not need_grad:
        return objective, sums, None
    target = outside.sub_(log_q_rest).exp_().mul_(p_rest).scatter_(1, idx, p)  # [C, V]
    grad = log_q.exp_().sub_(target).mul_(w.kl_weight)
    if w.ce_weight:
        soft = (zs - lse_s).exp_()
        soft.scatter_add_(1, safe, -torch.ones_like(safe, dtype=zs.dtype))
        grad.add_(soft, alpha=w.ce_weight)
    return objective, sums, grad.mul_(keep)


def _teacher_rows(teacher, rows: slice, labels: torch.Tensor, w: DistillWeights, acc: torch.dtype):
    """The teacher's part of one chunk: its logits `[C, V]` in `acc`, or a `TopK` (cut from the logits when
    `w.top_k` asks for one)."""
    if isinstance(teacher, TopK):
        return teacher[rows]
    zt = teacher[rows].to(acc)  # [C, V]
    return top_k_of(zt, labels, w.top_k) if w.top_k else zt


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
                zt = _teacher_rows(teacher_logits, rows, labels[rows], weights, acc)
                chunk = _chunk_top_k if isinstance(zt, TopK) else _chunk
                part, part_sums, grad = chunk(zs, zt, labels[rows], weights, need_h or need_w)
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
    teacher_logits: torch.Tensor | TopK,
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
        teacher_logits: `[N, V]` the teacher's logits of the same tokens (any float dtype; no gradient), or their
            `TopK` (the top-k KL, e.g. read from a logit cache).
        labels: `[N]` the next tokens, -100 where a token does not count (no KL, no CE).
        weights: kl_weight, ce_weight and temperature.
        chunk_size: rows per chunk (default `CHUNK_SIZE`).

    Returns:
        (objective float32 scalar (float64 for float64 inputs), sums `[3]` in the same dtype).
    """
    N, D = hidden.shape
    top = isinstance(teacher_logits, TopK)
    teacher_shape = [len(teacher_logits), "k"] if top else list(teacher_logits.shape)
    if tuple(weight.shape[1:]) != (D,) or teacher_shape != [N, "k" if top else weight.shape[0]]:
        raise ValueError(
            f"linear_distill_loss: hidden {list(hidden.shape)}, weight {list(weight.shape)} and teacher logits "
            f"{teacher_shape} do not match (expected [N, D], [V, D], [N, V] or a TopK of N rows)"
        )
    return _LinearDistill.apply(
        hidden,
        weight,
        teacher_logits if top else teacher_logits.detach(),
        labels.to(hidden.device, torch.long),
        weights,
        chunk_size or CHUNK_SIZE,
        matmul_dtype(hidden, weight),
        torch.is_grad_enabled(),
    )
