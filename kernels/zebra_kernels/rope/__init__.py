"""MLA's rotary embeddings of the query's RoPE part and the shared key: `rope_qk`, one Triton launch on a GPU
(`zebra_kernels.rope.triton_fused`) where the torch form (`torch_rotate_pairs`) is fourteen elementwise ones."""

from __future__ import annotations

import torch

from zebra_kernels.backend import resolve_backend
from zebra_kernels.rope.naive import torch_rotate_pairs

__all__ = ["rope_qk", "torch_rotate_pairs"]

TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def rope_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q `[B, T, H, D]` and k `[B, T, D]` by cos, sin `[B or 1, T, D / 2]` (`torch_rotate_pairs`: pairs
    (2i, 2i+1) by angle i, output de-interleaved).

    The Triton kernel runs on a GPU for bf16/fp16/fp32 inputs of one dtype when no gradient is needed and the
    backend is not "torch" (float32 math, one rounding; the torch form rounds after each operation).
    """
    fused = (
        q.device.type == "cuda"
        and q.dtype in TRITON_DTYPES
        and q.dtype == k.dtype == cos.dtype == sin.dtype
        and cos.stride() == sin.stride()
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        and resolve_backend(backend, q.device) != "torch"
    )
    if fused:
        from zebra_kernels.rope.triton_fused import triton_rope_qk

        return triton_rope_qk(q, k, cos, sin)
    return torch_rotate_pairs(q, cos[:, :, None], sin[:, :, None]), torch_rotate_pairs(k, cos, sin)
