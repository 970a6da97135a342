"""Helpers for comparing kernels: the relative error measure and realistic random inputs for every op.

Used by tests/kernels (CPU and GPU) and usable by model tests. Inputs mimic what the layers feed the kernels:
log decays from `-exp(A_log) * softplus(.)`-like ranges, beta in (0, 1), positive dt, negative A.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """`||out - ref|| / ||ref||` in float64 (FLA's tests use the same RMS ratio)."""
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _gen(seed: int, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def gdn_inputs(B, T, H, HV, K, V, *, dtype=torch.float64, device="cpu", seed=0, initial_state=False, N=None):
    """q, k `[B, T, H, K]`, v `[B, T, HV, V]`, g, beta `[B, T, HV]`, and h0 `[N or B, HV, K, V]` or None."""
    gen = _gen(seed, device)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float64)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, HV, V)
    g = F.logsigmoid(randn(B, T, HV) + 2.0) * 2.0  # log decay in about (-6, 0), mostly near -0.3
    beta = torch.sigmoid(randn(B, T, HV))
    h0 = randn(N or B, HV, K, V) * 0.5 if initial_state else None
    return tuple(None if x is None else x.to(dtype) for x in (q, k, v, g, beta, h0))


def kda_inputs(
    B, T, H, K, V, *, HV=None, dtype=torch.float64, device="cpu", seed=0, initial_state=False, N=None
):
    """q, k `[B, T, H, K]`, v `[B, T, HV, V]`, per-channel g `[B, T, HV, K]`, beta `[B, T, HV]`, h0 or None."""
    HV = HV or H
    gen = _gen(seed, device)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float64)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, HV, V)
    g = F.logsigmoid(randn(B, T, HV, K) + 2.0) * 2.0
    beta = torch.sigmoid(randn(B, T, HV))
    h0 = randn(N or B, HV, K, V) * 0.5 if initial_state else None
    return tuple(None if x is None else x.to(dtype) for x in (q, k, v, g, beta, h0))


def ssd_inputs(
    Bt, T, H, P, G, N, *, dtype=torch.float64, device="cpu", seed=0, initial_state=False, N_seq=None
):
    """x `[Bt, T, H, P]`, dt `[Bt, T, H]`, A `[H]`, B, C `[Bt, T, G, N]`, D `[H]`, h0 `[N_seq or Bt, H, N, P]`."""
    gen = _gen(seed, device)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float64)

    x = randn(Bt, T, H, P)
    dt = F.softplus(randn(Bt, T, H) - 2.0)  # Mamba2 dt: softplus(. + dt_bias), mostly 0.01..0.5
    A = -torch.exp(randn(H).abs())  # -exp(A_log), A_log in [0, ~2]
    B, C = randn(Bt, T, G, N) * 0.5, randn(Bt, T, G, N) * 0.5
    D = randn(H)
    h0 = randn(N_seq or Bt, H, N, P) * 0.5 if initial_state else None
    return tuple(None if t is None else t.to(dtype) for t in (x, dt, A, B, C, D, h0))
