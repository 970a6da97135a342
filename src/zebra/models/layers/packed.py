"""Fewer kernels per decode step: several projections of one input as one matmul, and weights derived from
parameters (stacked, reshaped, activated) made once per weight version instead of once per step.

A one-token decode step is bound by kernel launches, not bytes: GDN's six input projections are six GEMVs over
the same `[B, 1, D]`. `project` runs them as one GEMV over their weights stacked by rows. `derived` keeps such a
tensor on the module (not in its state dict), built on first use and rebuilt whenever a source tensor is replaced
or updated in place (keyed by storage and version counter). With grad enabled (training) nothing is kept: the
tensor is recomputed on every call, so autograd sees the parameters; prefill (more than one token) projects one
by one, so nothing changes for it and no stacked copy is made, unless the owner's `fuse_projections` is set
(`train.fuse_projections`, `zebra.train.parallelize.apply_fused_projections`): then one GEMM over the weights
concatenated in that forward, so each weight still gets its own gradient.

`use_fused_decode` switches the decode step's GEMVs to Zebra's own kernels (`zebra_kernels.gemv`): each sublayer's
pre-norm goes to its mixer's first projection (`Prenorm`) and a recurrent mixer's gated output norm to its output
projection (`decode_gated_norm_linear`), each run in the kernel's prologue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zebra.models.layers.norm import GatedRMSNorm, RMSNorm
from zebra_kernels import gated_rms_norm_linear, linear_rows, rms_norm_linear


@dataclass
class Prenorm:
    """A sublayer's pre-norm, handed to its mixer in a fused decode step (`use_fused_decode`): the mixer passes it
    to its first projection (`project`, `decode_linear`), which runs the norm and its residual add in the GEMV
    kernel's prologue and leaves the residual stream `x + residual` in `stream` for the sublayer."""

    norm: RMSNorm
    residual: torch.Tensor | None  # the stream before the mixer's input x (None: x is the embeddings)
    stream: torch.Tensor | None = None  # x + residual, once the projection ran

    def apply(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The norm on its own (where the fused kernel does not apply): the normed input; keeps the stream."""
        normed, self.stream = self.norm(hidden_states, self.residual, prenorm=True)
        return normed

    def linear(
        self, hidden_states: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`F.linear(norm(x), weight)` (with `up_weight`: SwiGLU of it and `F.linear(norm(x), up_weight)`) in one
        `zebra_kernels.rms_norm_linear`; keeps the stream."""
        out, self.stream = rms_norm_linear(
            hidden_states, self.norm.weight, weight, eps=self.norm.eps, residual=self.residual,
            up_weight=up_weight, backend=self.norm.backend,
        )  # fmt: skip
        return out


def derived(
    module: nn.Module,
    name: str,
    sources: Sequence[torch.Tensor],
    make: Callable[[Sequence[torch.Tensor]], torch.Tensor],
) -> torch.Tensor:
    """`make(sources)`, kept on `module` as `_<name>` while grad is disabled and the sources unchanged.

    Args:
        module: the owner (the tensor is not a parameter or buffer: not in its state dict).
        name: a name unique on `module`.
        sources: the tensors it is made from (parameters).
        make: the computation (e.g. `torch.cat`).
    """
    if torch.is_grad_enabled():
        return make(sources)
    key = tuple((t.data_ptr(), t._version) for t in sources)
    attr = "_" + name
    cached = module.__dict__.get(attr)
    if cached is None or cached[0] != key:
        cached = (key, make(sources))
        module.__dict__[attr] = cached
    return cached[1]


def project(
    module: nn.Module,
    hidden_states: torch.Tensor,
    names: Sequence[str],
    *,
    joined: int = 0,
    prenorm: Prenorm | None = None,
) -> list[torch.Tensor]:
    """`[module.get_submodule(name)(hidden_states) for name in names]` for bias-free `nn.Linear`s.

    Args:
        module: the owner of the projections; the stacked weight is kept on it (not in its state dict); its
            `fuse_projections` attribute (a bool, False by default) fuses them in training and prefill too.
        hidden_states: `[B, T, D]`.
        names: submodule names (`"q_proj"`, `"f_proj.0"`) of `nn.Linear(D, out_i, bias=False)` projections.
        joined: the first `joined` outputs come back as one tensor `[B, T, out_0 + ... ]` (a view of the
            stacked output while decoding, concatenated otherwise), followed by the others.
        prenorm: the sublayer's pre-norm still to apply to `hidden_states` (a fused decode step), or None.

    Returns:
        One `[B, T, out_i]` per name (views into one output when stacked), the first `joined` of them as one.
    """
    linears = [module.get_submodule(name) for name in names]
    widths = [lin.out_features for lin in linears]
    sizes = [sum(widths[:joined]), *widths[joined:]] if joined else widths
    fused = fused_decode_step(module, hidden_states)
    if prenorm is not None and not fused:
        hidden_states = prenorm.apply(hidden_states)
    if hidden_states.shape[1] != 1 or torch.is_grad_enabled():
        if getattr(module, "fuse_projections", False):
            weight = torch.cat(
                [lin.weight for lin in linears]
            )  # [sum out_i, D]; backward splits the gradient
            return list(F.linear(hidden_states, weight).split(sizes, dim=-1))
        outs = [linear(hidden_states) for linear in linears]
        head = [torch.cat(outs[:joined], dim=-1)] if joined else []
        return head + outs[joined:]
    name = "stacked_" + "_".join(names).replace(".", "_")
    weight = derived(module, name, [lin.weight for lin in linears], torch.cat)  # [sum out_i, D]
    if prenorm is not None and fused:
        out = prenorm.linear(hidden_states, weight)  # [B, 1, sum out_i]
    elif fused:
        out = linear_rows(hidden_states, weight)
    else:
        out = F.linear(hidden_states, weight)
    return list(out.split(sizes, dim=-1))


def fused_decode_step(module: nn.Module, hidden_states: torch.Tensor) -> bool:
    """A decode step (one token, no grad) of a module whose `fused_decode` is on (`use_fused_decode`)."""
    fused = getattr(module, "fused_decode", False)
    return fused and hidden_states.shape[1] == 1 and not torch.is_grad_enabled()


def fused_step(module: nn.Module, linear: nn.Module, hidden_states: torch.Tensor) -> bool:
    """Whether `linear` runs on Zebra's GEMV kernel here: a fused decode step of `module` and a plain bias-free
    `nn.Linear` (a float8 one keeps its own forward)."""
    plain = type(linear) is nn.Linear and linear.bias is None
    return plain and fused_decode_step(module, hidden_states)


def decode_linear(
    module: nn.Module, linear: nn.Module, hidden_states: torch.Tensor, prenorm: Prenorm | None = None
) -> torch.Tensor:
    """`linear(hidden_states)` (of `prenorm.apply(hidden_states)` with a pre-norm still to apply), on Zebra's GEMV
    kernel in `module`'s fused decode steps, with the pre-norm in its prologue."""
    fused = fused_step(module, linear, hidden_states)
    if prenorm is not None:
        return prenorm.linear(hidden_states, linear.weight) if fused else linear(prenorm.apply(hidden_states))
    return linear_rows(hidden_states, linear.weight) if fused else linear(hidden_states)


def decode_norm_linear(
    module: nn.Module, norm: nn.Module, linear: nn.Module, hidden_states: torch.Tensor
) -> torch.Tensor:
    """`linear(norm(hidden_states))`: `decode_linear` with the norm as its `Prenorm` when `norm` is an `RMSNorm`
    (MLA's query latent norm before its up projection), so a fused decode step runs it in the kernel's prologue."""
    if not (isinstance(norm, RMSNorm) and fused_decode_step(module, hidden_states)):
        return linear(norm(hidden_states))
    return decode_linear(module, linear, hidden_states, Prenorm(norm, None))


def decode_gated_norm_linear(
    module: nn.Module, norm: GatedRMSNorm, linear: nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """`linear(norm(x, gate))` of a recurrent mixer's output `x` `[B, T, K]`, the norm taken over each segment of
    `norm.weight`'s length (a head of GDN or KDA, all of Mamba2's channels): one kernel with the gated norm in its
    prologue in `module`'s fused decode steps."""
    if not fused_step(module, linear, hidden_states):
        segment = norm.weight.shape[0]
        normed = norm(hidden_states.unflatten(-1, (-1, segment)), gate.unflatten(-1, (-1, segment)))
        return linear(normed.flatten(-2))
    return gated_rms_norm_linear(
        hidden_states, gate, norm.weight, linear.weight, eps=norm.eps, group_size=norm.group_size,
        norm_before_gate=norm.norm_before_gate, activation=norm.activation, backend=norm.backend,
    )  # fmt: skip


def set_flag(model: nn.Module, name: str, on: bool = True) -> int:
    """Set the bool `name` on every module whose class declares it (`fused_decode`, `fuse_projections`);
    returns how many were set."""
    switched = 0
    for module in model.modules():
        if hasattr(type(module), name):
            setattr(module, name, on)
            switched += 1
    return switched


def use_fused_decode(model: nn.Module, on: bool = True) -> int:
    """Switch the decode step of every module that has a fused form (a class attribute `fused_decode`: the MLPs,
    Mamba2, GDN, KDA and MLA, each taking the sublayer's `Prenorm` into its first projection) to Zebra's GEMV
    kernels, or back; returns how many were switched. Inference only; prefill and training are unchanged."""
    return set_flag(model, "fused_decode", on)
