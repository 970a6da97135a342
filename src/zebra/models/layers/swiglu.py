"""SwiGLU MLP, the `-` sublayer (Llama)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """`down_proj(silu(gate_proj(x)) * up_proj(x))`.

    Reference: `GLU Variants Improve Transformer <https://arxiv.org/abs/2002.05202>`_

    Parameters: 3 * hidden_size * intermediate_size (no biases).

    Args:
        hidden_size: model width D.
        intermediate_size: inner width F.
    """

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.down_proj._is_residual_out = True

    def forward(self, hidden_states: torch.Tensor, **unused) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        return self.down_proj(F.silu(self.gate_proj(hidden_states)) * self.up_proj(hidden_states))
