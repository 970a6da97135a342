"""Helpers shared by every op: compute dtype, L2 norm, mode choice, input checks, packed sequences, and the device
our Triton kernels launch on.

Letters: B batch, T time, H heads, N sequences, C chunk size.
"""

from __future__ import annotations

import contextlib

import torch

# FLA's l2norm: x / sqrt(sum(x^2) + eps) with eps 1e-6 (fla/modules/norm/l2norm.py).
L2NORM_EPS = 1e-6
# FLA layers switch to the recurrent kernel for short inputs without grad (q_len <= 64).
RECURRENT_MAX_T = 64
MODES = ("auto", "chunk", "recurrent")


def on_device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """Where our Triton kernels launch: Triton takes the current CUDA device, so a tensor on another GPU (a model
    on cuda:1 in a process whose current device is 0) gets its device made current around the launch."""
    if t.device.type == "cuda" and t.device.index not in (None, torch.cuda.current_device()):
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64 (tests, gradcheck), else float32 (bf16/fp16/fp32 inputs)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """`x / sqrt(sum(x^2, -1) + eps)`, FLA's definition (not `F.normalize`, which clamps the norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def store_state_(state: torch.Tensor, new: torch.Tensor, feed: torch.Tensor | None) -> torch.Tensor:
    """Write `new` into the state buffer `state` in place where the 0-d bool `feed` is True (always when None):
    the torch form of the decode-step kernels that update a static cache's buffer. Returns `state`."""
    if feed is None:
        return state.copy_(new)
    return torch.where(feed, new.to(state.dtype), state, out=state)


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def choose_mode(mode: str, T: int, grad: bool) -> str:
    """Resolve `mode="auto"`: the recurrent form for short inputs without grad (decode), else chunk."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "auto":
        return "recurrent" if T <= RECURRENT_MAX_T and not grad else "chunk"
    return mode


def num_sequences(x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> int:
    """Rows of the state: B, or `len(cu_seqlens) - 1` for packed sequences (then B must be 1)."""
    if cu_seqlens is None:
        return x.shape[0]
    if x.shape[0] != 1:
        raise ValueError(
            f"with cu_seqlens the batch size must be 1 (sequences packed along T), got B={x.shape[0]}; "
            "flatten the batch with x.reshape(1, -1, ...) first"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be a 1-D tensor [N+1], got shape {tuple(cu_seqlens.shape)}")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != x.shape[1]:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at T={x.shape[1]}, got {cu_seqlens[0].item()}..{cu_seqlens[-1].item()}"
        )
    return cu_seqlens.numel() - 1


def check_state(state: torch.Tensor | None, expected: tuple[int, ...], name: str = "initial_state") -> None:
    if state is not None and tuple(state.shape) != expected:
        raise ValueError(f"{name} must have shape {list(expected)}, got {list(state.shape)}")


def _varlen_index(cu_seqlens: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather index [N, Tmax] into the packed time axis (T points at an extra zero row) and its valid mask."""
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]  # [N]
    t_max = int(lengths.max()) if lengths.numel() else 0
    t = torch.arange(t_max, device=cu.device)  # [Tmax]
    valid = t[None, :] < lengths[:, None]  # [N, Tmax]
    index = torch.where(valid, cu[:-1, None] + t[None, :], torch.full_like(valid, T, dtype=torch.long))
    return index, valid


def unpack(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Packed `[1, T, ...]` -> zero-padded batch `[N, Tmax, ...]` (padding after each sequence's end).

    Zero padding at the end is neutral for every recurrence here: k = v = beta = 0 and log-decay g = 0
    (delta rules), dt = 0 (SSD) leave the state unchanged, so final states need no masking.
    """
    index, _ = _varlen_index(cu_seqlens.to(x.device), x.shape[1])
    rows = torch.cat([x[0], x.new_zeros(1, *x.shape[2:])], dim=0)  # [T + 1, ...]
    return rows[index]


def pack(y: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Inverse of `unpack`: `[N, Tmax, ...]` -> `[1, T, ...]` (drops the padding)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(y.device)
    valid = torch.arange(y.shape[1], device=y.device)[None, :] < lengths[:, None]  # [N, Tmax]
    return y[valid].unsqueeze(0)


def pad_time(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero-pad dim 1 (time) of `[B, T, ...]` up to a multiple of `multiple`."""
    pad = (-x.shape[1]) % multiple
    if pad == 0:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], pad, *x.shape[2:])], dim=1)


def causal_mask(C: int, device: torch.device, strict: bool = False) -> torch.Tensor:
    """[C, C] bool, True where column j <= row i (j < i when strict)."""
    return torch.ones(C, C, dtype=torch.bool, device=device).tril(-1 if strict else 0)


def masked_decay(diff: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp(diff) where mask, exactly 0 elsewhere (masking before exp keeps overflow and NaN grads out)."""
    return diff.masked_fill(~mask, float("-inf")).exp()
