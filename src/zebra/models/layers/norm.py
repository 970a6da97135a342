"""RMSNorm (sublayer pre-norms with the residual add fused in, MLA latent norms) and the gated RMSNorm of the
recurrent mixers."""

from __future__ import annotations

import torch
from torch import nn

from zebra_kernels import rms_norm, rms_norm_gated


class RMSNorm(nn.Module):
    """`weight * s / sqrt(mean(s^2) + eps)` of `s = x (+ residual)`, computed in float32 (float64 for float64
    inputs), returned in x's dtype (`zebra_kernels.rms_norm`: one fused kernel on the fla backend).

    Args:
        hidden_size: channels C of the last dimension.
        eps: added to the mean square.
        backend: kernel backend ("auto", "torch", "fla").
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, backend: str = "auto"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.backend = backend

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, prenorm: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`[..., C]` -> `[..., C]`; with `prenorm` also the sum `x + residual` (the residual stream)."""
        return rms_norm(
            x, self.weight, eps=self.eps, residual=residual, prenorm=prenorm, backend=self.backend
        )

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GatedRMSNorm(nn.Module):
    """Gated RMSNorm (`zebra_kernels.rms_norm_gated`) holding its weight.

    - `norm_before_gate=True` (GDN/KDA `o_norm`, FLA FusedRMSNormGated): `rmsnorm(x) * weight * act(gate)`.
    - `norm_before_gate=False` (Mamba2, Megatron): `rmsnorm(x * act(gate)) * weight`, RMS over `group_size` blocks.

    Args:
        hidden_size: channels C.
        eps: added to the mean square.
        activation: "swish" or "sigmoid".
        norm_before_gate: see above.
        group_size: channels per RMS group (None = all C).
        backend: kernel backend ("auto", "torch", "fla").
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        activation: str = "swish",
        norm_before_gate: bool = True,
        group_size: int | None = None,
        backend: str = "auto",
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.activation = activation
        self.norm_before_gate = norm_before_gate
        self.group_size = group_size
        self.backend = backend

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # [..., C], [..., C] -> [..., C]
        return rms_norm_gated(
            x,
            gate,
            self.weight,
            eps=self.eps,
            activation=self.activation,
            norm_before_gate=self.norm_before_gate,
            group_size=self.group_size,
            backend=self.backend,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.weight.shape[0]}, eps={self.eps}, activation={self.activation}, "
            f"norm_before_gate={self.norm_before_gate}, group_size={self.group_size}"
        )
