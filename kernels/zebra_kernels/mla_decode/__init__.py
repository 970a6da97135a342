"""Absorbed MLA decode attention over a latent cache that reads only the cached tokens: `mla_decode`.

A static decode cache has a fixed capacity L; masking the slots past the length (`MultiLatentAttention`'s
general path) makes every step cost the capacity. This op takes the lengths as a device tensor instead: on a GPU
one split-K Triton kernel and a merge (`zebra_kernels.mla_decode.triton_fused`) read only the cached tokens, and a
captured CUDA graph stays valid at any length; elsewhere the torch form (`torch_mla_decode`) attends over the
first `max_length` slots when the caller knows them on the host.
"""

from __future__ import annotations

import torch

from zebra_kernels.backend import resolve_backend
from zebra_kernels.mla_decode.naive import torch_mla_decode, visible_keys

__all__ = ["mla_decode", "torch_mla_decode", "visible_keys"]

TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    lengths: torch.Tensor | int,
    scale: float,
    *,
    max_length: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of T new tokens' absorbed queries over the first `lengths` slots of a latent cache, causal over
    the last T of them.

    Args:
        q_latent: `[B, T, H, R]` (`q_nope W_uk`). q_rope: `[B, T, H, dr]`.
        latent: `[B, L, R]`, k_rope: `[B, L, dr]`: the cache's buffers (L the capacity).
        lengths: `[B]` or 0-d integer device tensor (or an int): tokens cached per row, the T new ones included.
        scale: the softmax scale.
        max_length: a host bound on every length (the torch path slices the cache to it; None = L).
        backend: "torch", or "auto" / "fla" / "mamba_ssm": the Triton kernels on a GPU for bf16/fp16/fp32
            (torch elsewhere for "auto").

    Returns:
        `[B, T, H, R]` in q_latent's dtype.
    """
    B, T, H, R = q_latent.shape
    if latent.dim() != 3 or latent.shape[0] != B or latent.shape[2] != R:
        raise ValueError(f"latent must have shape [B={B}, L, R={R}], got {list(latent.shape)}")
    if tuple(q_rope.shape[:3]) != (B, T, H) or tuple(k_rope.shape[:2]) != tuple(latent.shape[:2]):
        raise ValueError(
            f"q_rope [B, T, H, dr] / k_rope [B, L, dr] do not match: {list(q_rope.shape)}, {list(k_rope.shape)}"
        )
    if not torch.is_tensor(lengths):  # a fill on the device, not a copy from the host (no synchronisation)
        lengths = torch.full((), lengths, dtype=torch.long, device=latent.device)
    use_triton = (
        latent.device.type == "cuda"
        and q_latent.dtype in TRITON_DTYPES
        and resolve_backend(backend, latent.device) != "torch"
    )
    if use_triton:
        from zebra_kernels.mla_decode.triton_fused import triton_mla_decode

        return triton_mla_decode(q_latent, q_rope, latent, k_rope, lengths, scale)
    if max_length is not None and max_length < latent.shape[1]:
        latent, k_rope = latent[:, :max_length], k_rope[:, :max_length]
    return torch_mla_decode(q_latent, q_rope, latent, k_rope, lengths, scale)
