"""SwiGLU MLP, the `-` sublayer (Llama)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zebra.models.layers.packed import Prenorm, fused_step
from zebra_kernels import linear_rows, swiglu_linear


class SwiGLU(nn.Module):
    """`down_proj(silu(gate_proj(x)) * up_proj(x))` (`zebra_kernels.swiglu_linear` after the two projections).

    Reference: `GLU Variants Improve Transformer <https://arxiv.org/abs/2002.05202>`_

    Parameters: 3 * hidden_size * intermediate_size (no biases).

    Args:
        hidden_size: model width D.
        intermediate_size: inner width F.
        backend: kernel backend ("auto", "torch", "fla").
    """

    fused_decode: bool = False  # `packed.use_fused_decode`: a decode step in two kernels

    def __init__(self, hidden_size: int, intermediate_size: int, backend: str = "auto"):
        super().__init__()
        self.backend = backend
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.down_proj._is_residual_out = True

    @classmethod
    def from_config(cls, config: Any, layer_idx: int) -> SwiGLU:
        """The `-` sublayer of a `ZebraConfig` (`hidden_size`, `intermediate_size`)."""
        return cls(config.hidden_size, config.intermediate_size, backend=config.kernel_backend)

    def reset_parameters(self) -> None:
        """Nothing of its own: its three Linears keep their own (or the model's) initialisation."""

    def forward(
        self, hidden_states: torch.Tensor, prenorm: Prenorm | None = None, **unused: Any
    ) -> torch.Tensor:
        """`[B, T, D] -> [B, T, D]`; takes (and ignores) the sublayer call's mask, positions, cache and offsets.
        With `prenorm` (a fused decode step), two kernels on a GPU (`zebra_kernels.gemv`): the pre-norm with its
        residual add, gate, up and SwiGLU in one, the down projection in the other."""
        linears = (self.gate_proj, self.up_proj, self.down_proj)
        if prenorm is not None and all(fused_step(self, lin, hidden_states) for lin in linears):
            z = prenorm.linear(
                hidden_states, self.gate_proj.weight, up_weight=self.up_proj.weight
            )  # [B, 1, F]
            return linear_rows(z, self.down_proj.weight, backend=self.backend)
        if prenorm is not None:
            hidden_states = prenorm.apply(hidden_states)
        gate, up = self.gate_proj(hidden_states), self.up_proj(hidden_states)  # [B, T, F]
        if type(self.down_proj) is not nn.Linear:  # converted (float8, `train.fp8`): its own forward must run
            return self.down_proj(F.silu(gate) * up)
        return swiglu_linear(gate, up, self.down_proj.weight, self.down_proj.bias, backend=self.backend)
