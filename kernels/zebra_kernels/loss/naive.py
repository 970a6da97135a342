"""Chunked linear cross-entropy: the loss of `hidden @ weight.T` against labels without ever holding the
`[N, V]` logits. The chunk loop is shared by both backends; each chunk's cross entropy is torch here
(`torch_chunk_cross_entropy`) or FLA's Triton kernels (`zebra_kernels.loss.fla_backend`).

Per chunk of `chunk_size` rows the forward computes the logits, their log-sum-exp and target logit, and right
away the gradient `dlogits = softmax - onehot` (zero on ignored rows), which it turns into that chunk's rows of
d_hidden and adds into d_weight. Backward only scales the stored gradients by the incoming scalar. Peak extra
memory: about `chunk_size x V x (2 bytes of matmul-dtype logits + 4 bytes of float32 work)` plus d_weight
(`[V, D]`, float32) and d_hidden (`[N, D]`, hidden's dtype).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def torch_chunk_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    row_scale: torch.Tensor,
    *,
    ignore_index: int,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk's `sum(CE * row_scale)` and its gradient w.r.t. the logits, in torch.

    Args:
        logits: `[C, V]` in the matmul dtype.
        targets: `[C]` class ids, `ignore_index` on rows that do not count.
        row_scale: `[C]` float32/64 weight of each row (0 on ignored rows).
        need_grad: also return `dlogits = (softmax - onehot) * row_scale` `[C, V]` in logits' dtype.
    """
    acc_dtype = row_scale.dtype
    valid = targets != ignore_index  # [C]
    safe = torch.where(valid, targets, 0)[:, None]  # [C, 1]: ignored rows point at class 0, scaled by 0
    z = logits.to(acc_dtype)  # [C, V]
    lse = torch.logsumexp(z, dim=-1)  # [C]
    loss = ((lse - z.gather(1, safe).squeeze(1)) * row_scale).sum()
    if not need_grad:
        return loss, None
    z.sub_(lse[:, None]).exp_()  # softmax, in place
    z.scatter_add_(1, safe, -valid[:, None].to(acc_dtype))  # - onehot on counted rows
    return loss, z.mul_(row_scale[:, None]).to(logits.dtype)


ChunkCrossEntropy = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def _chunk_loss_and_grads(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_ce: ChunkCrossEntropy,
    ignore_index: int,
    mean: bool,
    chunk_size: int,
    matmul_dtype: torch.dtype,
    acc_dtype: torch.dtype,
    need_hidden_grad: bool,
    need_weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(loss, d_hidden or None, d_weight or None) for grad_output = 1; see `chunked_linear_cross_entropy`."""
    N = hidden.shape[0]
    w = weight.to(matmul_dtype)  # [V, D], cast once
    valid = labels != ignore_index  # [N]
    # mean: every row's gradient carries 1 / count (all ignored: count 0 -> loss 0 and zero gradients)
    row_scale = valid.to(acc_dtype) / valid.sum().clamp(min=1) if mean else valid.to(acc_dtype)  # [N]
    need_grad = need_hidden_grad or need_weight_grad
    d_hidden = torch.empty_like(hidden) if need_hidden_grad else None  # [N, D]
    d_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_weight_grad else None
    loss = torch.zeros((), dtype=acc_dtype, device=hidden.device)
    for start in range(0, N, chunk_size):
        rows = slice(start, min(start + chunk_size, N))
        h = hidden[rows].to(matmul_dtype)  # [C, D]
        chunk_loss, dlogits = chunk_ce(
            h @ w.T, labels[rows], row_scale[rows], ignore_index=ignore_index, need_grad=need_grad
        )  # dlogits [C, V] in the matmul dtype
        loss += chunk_loss
        if d_hidden is not None:
            d_hidden[rows] = dlogits @ w  # [C, D]
        if d_weight is not None:
            add_product(d_weight, dlogits.T, h)  # [V, D]: summed over chunks in float32 (float64)
    return loss, d_hidden, d_weight


def add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """`acc += a @ b` for a float32 `acc` and half-precision `a`, `b`: on CUDA the GEMM adds into `acc` in its float32
    epilogue (`out_dtype`), where elsewhere a half-precision `[V, D]` product is written, rounded, then added."""
    if (
        acc.is_cuda
        and torch.version.hip is None
        and acc.dtype == torch.float32
        and a.dtype in (torch.bfloat16, torch.float16)
    ):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc += a @ b


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Autograd wrapper of `_chunk_loss_and_grads`: the gradients are computed in forward and kept."""

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        labels,
        chunk_ce,
        ignore_index,
        mean,
        chunk_size,
        matmul_dtype,
        acc_dtype,
        grad_mode,
    ):
        # needs_input_grad says requires_grad even under no_grad: the caller's grad mode decides
        need_h, need_w = grad_mode and ctx.needs_input_grad[0], grad_mode and ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):  # the matmul dtype is chosen by the caller
            loss, d_hidden, d_weight = _chunk_loss_and_grads(
                hidden,
                weight,
                labels,
                chunk_ce=chunk_ce,
                ignore_index=ignore_index,
                mean=mean,
                chunk_size=chunk_size,
                matmul_dtype=matmul_dtype,
                acc_dtype=acc_dtype,
                need_hidden_grad=need_h,
                need_weight_grad=need_w,
            )
        ctx.d_hidden, ctx.d_weight, ctx.weight_dtype = d_hidden, d_weight, weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        d_hidden = None if ctx.d_hidden is None else ctx.d_hidden * grad_loss.to(ctx.d_hidden.dtype)
        d_weight = None if ctx.d_weight is None else (ctx.d_weight * grad_loss).to(ctx.weight_dtype)
        return d_hidden, d_weight, None, None, None, None, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_ce: ChunkCrossEntropy = torch_chunk_cross_entropy,
    ignore_index: int,
    mean: bool,
    chunk_size: int,
    matmul_dtype: torch.dtype,
    acc_dtype: torch.dtype,
) -> torch.Tensor:
    """Args/shapes as `zebra_kernels.linear_cross_entropy`; matmuls in `matmul_dtype`, the rest in `acc_dtype`;
    `chunk_ce` computes each chunk's loss and logit gradient (`torch_chunk_cross_entropy`, or FLA's Triton
    kernels on the fla backend).

    Returns the loss in `acc_dtype` (float32, or float64 for float64 inputs).
    """
    return ChunkedLinearCrossEntropy.apply(
        hidden,
        weight,
        labels,
        chunk_ce,
        ignore_index,
        mean,
        chunk_size,
        matmul_dtype,
        acc_dtype,
        torch.is_grad_enabled(),
    )
