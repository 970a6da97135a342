"""Decode GEMVs: a one-token step's projections with the norm before them in their prologue and SwiGLU in
their epilogue (on a GPU, `gemv.triton_fused`: one kernel each).

A decode step reads every weight once for a few rows of activations. The unfused MLP sublayer is five kernels
(the norm with its residual add, gate, up, SwiGLU, down); `rms_norm_linear(..., up_weight=)` and `linear_rows`
make it two, and read gate and up in one pass. `rms_norm_linear` also takes the pre-norm into a mixer's input
projection, and `gated_rms_norm_linear` a recurrent mixer's gated output norm into its output projection. All are
inference-only (no backward) and exact to the unfused path's roundings: the normed activations and each
projection's output are rounded to the activations' dtype where the unfused path stores them, so they differ
from it only by the order of the float32 sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zebra_kernels._common import needs_grad
from zebra_kernels.backend import resolve_fusible_backend
from zebra_kernels.norm import rms_norm, rms_norm_gated

MAX_ROWS = 8  # activation rows (decode batch) the kernel takes; more are a GEMM's work
MAX_GATED_GROUP = 512  # channels per gated-norm group the kernel takes whole in a K block (a power of two)


def _kernel_applies(x: torch.Tensor, backend: str, *tensors: torch.Tensor | None) -> bool:
    rows = x.numel() // x.shape[-1]
    return (
        rows <= MAX_ROWS
        and x.dtype != torch.float64
        and not needs_grad(x, *tensors)
        and resolve_fusible_backend(backend, x.device) == "fla"
    )


def _project(h: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None) -> torch.Tensor:
    if up_weight is None:
        return F.linear(h, weight)
    return F.silu(F.linear(h, weight)) * F.linear(h, up_weight)


def linear_rows(
    x: torch.Tensor, weight: torch.Tensor, *, up_weight: torch.Tensor | None = None, backend: str = "auto"
) -> torch.Tensor:
    r"""`F.linear(x, weight)` for a few rows of x, or `silu(F.linear(x, weight)) * F.linear(x, up_weight)`.

    Args:
        x: `[..., K]`, at most `MAX_ROWS` rows for the kernel (more run as torch's GEMMs).
        weight: `[N, K]` (columns contiguous).
        up_weight: `[N, K]`, SwiGLU's up projection beside `weight` (the gate), or None.
        backend: "auto", "torch" or "fla" (see `resolve_backend`).

    Returns:
        `[..., N]` in x's dtype.

    Examples:
        >>> x, w = torch.randn(1, 1, 8), torch.randn(4, 8)
        >>> linear_rows(x, w).shape
        torch.Size([1, 1, 4])
    """
    if not _kernel_applies(x, backend, weight, up_weight):
        return _project(x, weight, up_weight)
    from zebra_kernels.gemv.triton_fused import triton_gemv

    y, _ = triton_gemv(x.reshape(-1, x.shape[-1]), weight, up_weight=up_weight)
    return y.view(*x.shape[:-1], weight.shape[0])


def rms_norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    residual: torch.Tensor | None = None,
    up_weight: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""A pre-norm sublayer's first projection: `(linear_rows(h, weight, up_weight=up_weight), s)` where
    `h, s = rms_norm(x, norm_weight, eps=eps, residual=residual, prenorm=True)`.

    Args:
        x: `[..., K]`, the previous sublayer's output (at most `MAX_ROWS` rows for the kernel).
        norm_weight: `[K]`, the pre-norm's weight.
        weight: `[N, K]`.
        eps: the norm's epsilon.
        residual: `[..., K]`, the stream before x, or None (then the stream is x).
        up_weight: `[N, K]` (SwiGLU's up projection beside the gate `weight`) or None.
        backend: "auto", "torch" or "fla".

    Returns:
        The projection `[..., N]` in x's dtype, and the stream `s = x + residual` in residual's dtype.

    Examples:
        >>> x, r, w = torch.randn(1, 1, 8), torch.randn(1, 1, 8), torch.randn(4, 8)
        >>> y, s = rms_norm_linear(x, torch.ones(8), w, eps=1e-6, residual=r)
        >>> torch.equal(s, x + r), y.shape
        (True, torch.Size([1, 1, 4]))
    """
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {list(x.shape)}, got {list(residual.shape)}")
    if not _kernel_applies(x, backend, norm_weight, weight, up_weight, residual):
        h, stream = rms_norm(x, norm_weight, eps=eps, residual=residual, prenorm=True, backend=backend)
        return _project(h, weight, up_weight), stream
    from zebra_kernels.gemv.triton_fused import triton_gemv

    rows = x.reshape(-1, x.shape[-1])
    y, stream = triton_gemv(
        rows,
        weight,
        up_weight=up_weight,
        norm_weight=norm_weight,
        residual=None if residual is None else residual.reshape(rows.shape),
        eps=eps,
    )
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y, x if stream is None else stream.view(x.shape)


def gated_rms_norm_linear(
    x: torch.Tensor,
    gate: torch.Tensor,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    activation: str = "swish",
    backend: str = "auto",
) -> torch.Tensor:
    r"""A recurrent mixer's gated output norm and its output projection: `F.linear(n, weight)` where
    `n = rms_norm_gated(x, gate, norm_weight, ...)` applied to each `C`-channel segment of x's last dim (C =
    `norm_weight`'s length: one head of GDN or KDA, all of Mamba2's channels).

    Args:
        x: `[..., K]`, K a multiple of C (for the kernel: at most `MAX_ROWS` rows, groups of a power of two up to
            `MAX_GATED_GROUP` channels).
        gate: `[..., K]`.
        norm_weight: `[C]`.
        weight: `[N, K]`.
        eps, group_size, norm_before_gate, activation: as `rms_norm_gated` (its groups within a segment).
        backend: "auto", "torch" or "fla".

    Returns:
        `[..., N]` in x's dtype.

    Examples:
        >>> x, g, w = torch.randn(1, 1, 8), torch.randn(1, 1, 8), torch.randn(3, 8)
        >>> gated_rms_norm_linear(x, g, torch.ones(4), w, eps=1e-6).shape  # two segments of 4 channels
        torch.Size([1, 1, 3])
    """
    if gate.shape != x.shape:
        raise ValueError(f"gate must have x's shape {list(x.shape)}, got {list(gate.shape)}")
    segment = norm_weight.shape[0]
    group = group_size or segment
    if x.shape[-1] % segment or segment % group:
        raise ValueError(
            f"x's last dim {x.shape[-1]} must be whole segments of {segment}, in groups of {group}"
        )
    fits = group & (group - 1) == 0 and group <= MAX_GATED_GROUP
    if not (fits and _kernel_applies(x, backend, gate, norm_weight, weight)):
        normed = rms_norm_gated(
            x.unflatten(-1, (-1, segment)), gate.unflatten(-1, (-1, segment)), norm_weight, eps=eps,
            activation=activation, norm_before_gate=norm_before_gate, group_size=group_size, backend=backend,
        ).flatten(-2)  # fmt: skip
        return F.linear(normed, weight)
    from zebra_kernels.gemv.triton_fused import triton_gemv

    y, _ = triton_gemv(
        x.reshape(-1, x.shape[-1]),
        weight,
        norm_weight=norm_weight,
        gate=gate.reshape(-1, gate.shape[-1]),
        eps=eps,
        group_size=group,
        norm_before_gate=norm_before_gate,
        sigmoid=activation == "sigmoid",
    )
    return y.view(*x.shape[:-1], weight.shape[0])
