"""Cross entropy of a linear head without the logits: `linear_cross_entropy` (the language-model loss of
`hidden @ weight.T`, computed over row chunks so the `[N, V]` logits never exist)."""

from __future__ import annotations

import torch

from zebra_kernels._common import compute_dtype
from zebra_kernels.backend import resolve_backend
from zebra_kernels.loss.naive import chunked_linear_cross_entropy, torch_chunk_cross_entropy

__all__ = [
    "CHUNK_SIZE",
    "chunked_linear_cross_entropy",
    "linear_cross_entropy",
    "matmul_dtype",
    "torch_chunk_cross_entropy",
]

REDUCTIONS = ("sum", "mean")
# rows per chunk: at V = 128256 one chunk is 4096 x V = 1.05 GB of bf16 logits (plus 2.1 GB of float32 work on
# the torch backend); fewer chunks mean fewer float32 additions of a [V, D] partial d_weight
CHUNK_SIZE = 4096


def matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype `F.linear(hidden, weight)` would compute in: the autocast dtype when autocast is on for
    hidden's device (and neither input is float64), else the promoted dtype of the two inputs."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device) and torch.float64 not in (hidden.dtype, weight.dtype):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "sum",
    chunk_size: int = CHUNK_SIZE,
    backend: str = "auto",
) -> torch.Tensor:
    r"""`F.cross_entropy(hidden @ weight.T, labels, ignore_index=..., reduction=...)` without the `[N, V]` logits.

    The rows are processed `chunk_size` at a time: each chunk's logits are computed in the matmul dtype (the
    autocast dtype under autocast, e.g. bf16 with float32 master weights cast once; else the inputs' dtype),
    their log-sum-exp and target logit in float32 (float64 for float64 inputs; FLA's Triton cross-entropy
    kernels on the fla backend), and the gradients w.r.t. hidden and weight right away (d_weight summed over
    chunks in float32). Backward only scales them, so the loss must be backpropagated once (like FLA's fused
    kernel). Gradients reach a tied embedding through `weight`.
    `reduction="mean"` divides by the number of non-ignored rows; with every row ignored the loss is 0 (with
    zero gradients) for both reductions, where `F.cross_entropy`'s mean gives NaN.

    Args:
        hidden: `[N, D]` final hidden states (flatten `[B, T, D]` first).
        weight: `[V, D]` the output head (the lm_head or tied embedding weight).
        labels: `[N]` int target classes in [0, V), or `ignore_index` for rows that do not count.
        ignore_index: the label of rows left out of the loss.
        reduction: "sum" or "mean" (over non-ignored rows).
        chunk_size: rows per chunk (extra memory ~ chunk_size x V x 6 bytes with bf16 matmuls on the torch
            backend, x 2 bytes on fla).
        backend: "auto", "torch" or "fla" (FLA's cross-entropy kernels per chunk, GPU only; float64 inputs
            always take torch; see `resolve_backend`).

    Returns:
        The scalar loss, float32 (float64 for float64 inputs).

    Examples:
        >>> h, w, y = torch.randn(6, 4), torch.randn(10, 4), torch.tensor([1, 2, -100, 3, 4, 5])
        >>> loss = linear_cross_entropy(h, w, y, reduction="mean", chunk_size=4)
        >>> torch.allclose(loss, torch.nn.functional.cross_entropy(h @ w.T, y))
        True
    """
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, D], got shape {list(hidden.shape)}")
    N, D = hidden.shape
    if weight.dim() != 2 or weight.shape[1] != D:
        raise ValueError(f"weight must have shape [V, {D}], got {list(weight.shape)}")
    if tuple(labels.shape) != (N,):
        raise ValueError(f"labels must have shape [N] = [{N}], got {list(labels.shape)}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    labels = labels.to(hidden.device, torch.long)
    acc_dtype = compute_dtype(hidden, weight)
    chunk_ce = torch_chunk_cross_entropy
    if resolve_backend(backend, hidden.device) == "fla" and acc_dtype == torch.float32:
        from zebra_kernels.loss.fla_backend import fla_chunk_cross_entropy

        chunk_ce = fla_chunk_cross_entropy
    return chunked_linear_cross_entropy(
        hidden,
        weight,
        labels,
        chunk_ce=chunk_ce,
        ignore_index=ignore_index,
        mean=reduction == "mean",
        chunk_size=chunk_size,
        matmul_dtype=matmul_dtype(hidden, weight),
        acc_dtype=acc_dtype,
    )
