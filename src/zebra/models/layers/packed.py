"""Several bias-free projections of one input as one matmul.

A one-token decode step is bound by kernel launches, not bytes: GDN's six input projections are six GEMVs over
the same `[B, 1, D]`. `project` runs them as one GEMV over their weights stacked by rows, built on first use and
rebuilt whenever a weight is replaced or updated in place (keyed by storage and version counter). Training and
prefill (grad enabled, or more than one token) call the projections one by one, unless the owner's
`fuse_projections` is set (`train.fuse_projections`, `zebra.train.parallelize.apply_fused_projections`): then one
GEMM over the weights concatenated in that forward, so each weight still gets its own gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def project(module: nn.Module, hidden_states: torch.Tensor, names: Sequence[str]) -> list[torch.Tensor]:
    """`[module.get_submodule(name)(hidden_states) for name in names]` for bias-free `nn.Linear`s.

    Args:
        module: the owner of the projections; the stacked weight is kept on it (not in its state dict); its
            `fuse_projections` attribute (a bool, False by default) fuses them in training and prefill too.
        hidden_states: `[B, T, D]`.
        names: submodule names (`"q_proj"`, `"f_proj.0"`) of `nn.Linear(D, out_i, bias=False)` projections.

    Returns:
        One `[B, T, out_i]` per name (views into one output when stacked).
    """
    linears = [module.get_submodule(name) for name in names]
    widths = [lin.out_features for lin in linears]
    if hidden_states.shape[1] != 1 or torch.is_grad_enabled():
        if not getattr(module, "fuse_projections", False):
            return [linear(hidden_states) for linear in linears]
        weight = torch.cat([lin.weight for lin in linears])  # [sum out_i, D]; backward splits the gradient
        return list(F.linear(hidden_states, weight).split(widths, dim=-1))
    key = tuple((lin.weight.data_ptr(), lin.weight._version) for lin in linears)
    attr = "_stacked_" + "_".join(names).replace(".", "_")
    cached = module.__dict__.get(attr)
    if cached is None or cached[0] != key:
        cached = (key, torch.cat([lin.weight for lin in linears]))  # [sum out_i, D]
        module.__dict__[attr] = cached
    out = F.linear(hidden_states, cached[1])  # [B, 1, sum out_i]
    return list(out.split(widths, dim=-1))
