"""Data-driven gates for the recurrent mixers, from what the teacher's attention heads do (Taylor-Calibrate's
analytic init, arXiv 2606.16429, mapped onto Zebra's mixers), and the least-squares value scale of any mixer.

**Decay from attention distance.** A head whose attention row reaches back d tokens on average (the mean of
E_j[i - j], floor 0.5) keeps what it reads for about d tokens; a recurrent state forgets at the rate
exp(-g) a token, so the state's half-life ln 2 / g is set equal to d: g = ln 2 / d, clamped to [1e-3, 5]. Every
Zebra mixer computes its log decay as -exp(A_log) * softplus(raw + dt_bias), with `raw` a projection of the input:
A_log = 0, dt_bias = softplus^-1(g) and the raw projection zeroed make the decay exactly g at the start and still
input-dependent once trained (the projection gets gradients).

    Mamba2  A_log[h] = 0, dt_bias[h] = softplus^-1(g_h), in_proj's dt rows zeroed (dt also scales the write)
    GDN     A_log[h] = 0, dt_bias[h] = softplus^-1(g_h), a_proj zeroed
    KDA     A_log[h] = 0, dt_bias[h, :] = softplus^-1(g_h) on every key channel of h, f_proj's up factor zeroed

**Write strength from entropy (GDN, KDA).** A head with a sharp attention row (low entropy) reads one token and
should overwrite its state with it; a diffuse head averages and should write softly. The mean row entropies of a
layer's heads are normalised to a concentration c in [0, 1] (1 = the sharpest head of the layer) and
beta = 0.3 + 0.4 c. b_proj has no bias, so its rows become logit(beta_h) x_mean / ||x_mean||^2 (x_mean: the mean
attention input on the calibration text): beta is beta_h at the mean input and still moves with the input.

**Pass-through short convs and a steady output gate** (`FitOptions.pass_through`). The copied W_q, W_k, W_v
feed attention directly; a recurrent mixer passes them through a depthwise causal conv of width W and SiLU first,
and the conv starts random (each channel a random mix of the last W tokens, plus a bias). Set to the identity (the
newest token's tap 1, the others and the bias 0), q, k and v start as SiLU of the teacher's projections of the
current token, as Taylor-Calibrate's students have them (no short conv); the fit can still learn a filter. The
output gate (Mamba2's z rows of in_proj, GDN's and GLA's g_proj, KDA's two-factor g_proj) starts as a random
projection: every channel multiplied by act(random x), noise on top of the copied W_o. Its rows are set to
c x_mean / ||x_mean||^2 (c = 3, x_mean the layer's mean input), so the gate is act(3) (SiLU 2.86, sigmoid 0.95) at
the mean input, the same on every channel of a token: Mamba2's group RMSNorm after the gate cancels it, and after
GDN's norm it is a near-constant factor the value scale absorbs. It stays input-dependent once trained.

**Value scale.** With the gates set, one scalar per head s_h multiplies that head's columns of the output
projection, fitted jointly by least squares so that sum_h s_h W_o[:, h] c_h is closest to the teacher attention's
output (c_h: the mixer's head output before the projection). Scaling v itself would be undone by the per-head
output RMSNorm of Mamba2 / GDN / KDA, the projection's columns are not; it can only lower the error.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

DISTANCE_FLOOR = 0.5
DECAY_RANGE = (1e-3, 5.0)
BETA_RANGE = (0.3, 0.7)  # beta = 0.3 + 0.4 c
STEADY_GATE = 3.0  # the output gate's pre-activation at the layer's mean input (pass_through)


def decay_from_distance(distance: torch.Tensor) -> torch.Tensor:
    """Per-head log decay rate g [H] = ln 2 / max(distance, 0.5), clamped to [1e-3, 5]."""
    return (math.log(2.0) / distance.clamp(min=DISTANCE_FLOOR)).clamp(*DECAY_RANGE)


def beta_from_entropy(entropy: torch.Tensor) -> torch.Tensor:
    """Per-head write strength [H] in [0.3, 0.7]: 0.7 for the layer's sharpest head, 0.3 for its most diffuse."""
    spread = entropy.max() - entropy.min()
    concentration = (entropy.max() - entropy) / spread if spread > 0 else entropy.new_full(entropy.shape, 0.5)
    low, high = BETA_RANGE
    return low + (high - low) * concentration


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    """y with softplus(y) == x (x > 0)."""
    import torch

    return x + torch.log(-torch.expm1(-x))


def mamba2_gates(
    mixer: nn.Module, distance: torch.Tensor, entropy: torch.Tensor, mean_input: torch.Tensor
) -> dict[str, list[float]]:
    """Set a Mamba2 mixer's decay from the teacher heads' attention `distance` [H] (`entropy` [H] and the layer's
    mean input [D] are unused: Mamba2 has no beta). Returns {"decay": g per head}, for the report."""
    g, bias = _decay(distance)
    with _no_grad():
        mixer.A_log.zero_()
        mixer.dt_bias.copy_(bias)
        mixer.in_proj.weight[-mixer.num_heads :].zero_()  # the dt rows
    return {"decay": _rounded(g, 5)}


def delta_rule_gates(
    mixer: nn.Module, distance: torch.Tensor, entropy: torch.Tensor, mean_input: torch.Tensor
) -> dict[str, list[float]]:
    """Set a GDN or KDA mixer's decay from the teacher heads' `distance` [H] and its beta from their `entropy`
    [H] and the layer's mean input `mean_input` [D]. Returns {"decay": g, "beta": beta} per head, for the report."""
    import torch

    g, bias = _decay(distance)
    beta = beta_from_entropy(entropy).to(torch.float32)
    with _no_grad():
        mixer.A_log.zero_()
        if hasattr(mixer, "f_proj"):  # KDA: one decay per key channel, from f_proj's up factor
            mixer.dt_bias.copy_(bias.repeat_interleave(mixer.head_dim))  # [H * K]
            mixer.f_proj[1].weight.zero_()
        else:  # GDN: one decay per head, from a_proj
            mixer.dt_bias.copy_(bias)
            mixer.a_proj.weight.zero_()
        # the mixer and its mean input may be on a GPU, the teacher heads' records are on the CPU
        direction = mean_input.float() / mean_input.float().pow(2).sum().clamp(min=1e-12)  # [D]
        logit = torch.log(beta / (1 - beta)).to(direction.device)  # [H]
        mixer.b_proj.weight.copy_(logit[:, None] * direction[None, :])
    return {"decay": _rounded(g, 5), "beta": _rounded(beta, 4)}


def _decay(distance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The log decay rate g [H] and its inverse softplus (the dt_bias that gives it with A_log = 0)."""
    import torch

    g = decay_from_distance(distance).to(torch.float32)  # [H]
    return g, inverse_softplus(g)


def _no_grad():
    import torch

    return torch.no_grad()


def _rounded(values: torch.Tensor, digits: int) -> list[float]:
    return [round(float(v), digits) for v in values]


def pass_through(mixer: nn.Module, mean_input: torch.Tensor) -> list[str]:
    """Set the mixer's short convs to the identity and its output gate steady at the mean input `[D]` (module
    docstring). Returns the names of the tensors set (none for a mixer without either, e.g. MLA)."""
    import torch

    done: list[str] = []
    direction = STEADY_GATE * mean_input.float() / mean_input.float().pow(2).sum().clamp(min=1e-12)  # [D]
    with torch.no_grad():
        for name in ("conv1d", "q_conv1d", "k_conv1d", "v_conv1d"):
            conv = getattr(mixer, name, None)
            if conv is not None:  # weight [C, 1, W]: the newest token is the last tap
                conv.weight.zero_()
                conv.weight[..., -1] = 1.0
                if conv.bias is not None:
                    conv.bias.zero_()
                done.append(name)
        gate = getattr(mixer, "g_proj", None)
        if isinstance(gate, torch.nn.Linear):  # GDN, GLA
            gate.weight.copy_(direction.expand_as(gate.weight))
            done.append("g_proj")
        elif gate is not None:  # KDA: D -> V -> H*V, the up factor summing V ones to c
            down, up = gate[0], gate[1]
            down.weight.copy_((direction / STEADY_GATE).expand_as(down.weight))
            up.weight.fill_(STEADY_GATE / down.weight.shape[0])
            if up.bias is not None:
                up.bias.zero_()
            done.append("g_proj")
        elif hasattr(mixer, "in_proj") and hasattr(mixer, "d_inner"):  # Mamba2: the z rows come first
            mixer.in_proj.weight[: mixer.d_inner].copy_(direction.expand(mixer.d_inner, -1))
            done.append("in_proj.z")
    return done


def output_projection(mixer: nn.Module) -> nn.Linear:
    """The mixer's output projection: `o_proj` (MLA, GDN, KDA) or `out_proj` (Mamba2)."""
    return mixer.o_proj if hasattr(mixer, "o_proj") else mixer.out_proj


def fit_value_scale(mixer: nn.Module, head_outputs: torch.Tensor, target: torch.Tensor) -> list[float]:
    """Scale each head's columns of the output projection by the joint least-squares s [H].

    Args:
        mixer: the mixer (its output projection is changed in place).
        head_outputs: `[N, H, Dv]` what enters the output projection, per head, on the calibration tokens.
        target: `[N, D]` the teacher attention's output on the same tokens.
    """
    import torch

    proj = output_projection(mixer)
    _, H, Dv = head_outputs.shape
    w = proj.weight.detach().float().view(-1, H, Dv)  # [D, H, Dv]
    per_head = torch.einsum("nhv,dhv->hnd", head_outputs.float(), w).flatten(1)  # [H, N * D]
    gram = (per_head @ per_head.T).double()  # [H, H]
    rhs = (per_head @ target.float().flatten()).double()  # [H]
    scale = torch.linalg.lstsq(gram, rhs[:, None]).solution[:, 0].float()  # [H]
    with torch.no_grad():
        proj.weight.copy_((w * scale[None, :, None]).view_as(proj.weight))
    return [round(float(s), 4) for s in scale]
