"""One chunk's cross entropy on FLA's Triton kernels (`fla.modules.fused_cross_entropy`), GPU only.

The chunk loop stays ours (`chunked_linear_cross_entropy`: bf16 matmuls under autocast, d_weight summed in
float32). FLA's own `fused_linear_cross_entropy` is not used: with float32 master weights it sums d_weight with
float32 matmuls (its `accumulate_grad_in_fp32`), several times slower than the bf16 tensor-core path. What FLA
adds here is the per-chunk cross entropy: one kernel for the log-sum-exp and loss, and one that overwrites the
bf16 logits with their gradient in place, instead of a float32 copy and a chain of elementwise kernels.
"""

from __future__ import annotations

import torch


def fla_chunk_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    row_scale: torch.Tensor,
    *,
    ignore_index: int,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Args/returns as `zebra_kernels.loss.naive.torch_chunk_cross_entropy` (logits are overwritten)."""
    from fla.modules.fused_cross_entropy.ops import cross_entropy_bwd, cross_entropy_fwd

    logits = logits.contiguous()
    loss, _, lse, total_classes, class_start_idx = cross_entropy_fwd(
        logits=logits, target=targets, ignore_index=ignore_index
    )  # loss, lse [C] float32; loss 0 on ignored rows
    chunk_loss = (loss.to(row_scale.dtype) * row_scale).sum()
    if not need_grad:
        return chunk_loss, None
    dlogits = cross_entropy_bwd(
        logits=logits,
        target=targets,
        lse=lse,
        dloss=row_scale.float(),
        ignore_index=ignore_index,
        total_classes=total_classes,
        class_start_idx=class_start_idx,
        inplace_backward=True,
    )  # (softmax - onehot) * row_scale, [C, V] in logits' dtype
    return chunk_loss, dlogits
