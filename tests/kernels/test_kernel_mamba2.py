"""Mamba2 SSD torch reference: chunk == naive, both == an independent recurrence written here and FLA's
simple-GLA naive reference (SSD == simple GLA with q=C, k=B, v=x*dt, g=dt*A), packed == separate sequences,
gradcheck of the chunk form; the fused decode step (`mamba2_ssd_step`) == one token of it (its Triton kernel:
test_triton_steps.py). float64 on CPU."""

from __future__ import annotations

import pytest
import torch

from zebra_kernels import mamba2_ssd, mamba2_ssd_step
from zebra_kernels.testing import relative_error, ssd_inputs

TIGHT = 1e-10


def ssd_by_hand(x, dt, A, B, C, D, h0):
    """Mamba2's recurrence, one head and one step at a time: S = exp(dt A) S + dt B x^T, y = S^T C + D x."""
    Bt, T, H, P = x.shape
    R = H // B.shape[2]
    y = torch.zeros_like(x)
    S = torch.zeros(Bt, H, B.shape[3], P, dtype=x.dtype) if h0 is None else h0.clone()
    for t in range(T):
        for h in range(H):
            grp = h // R
            S[:, h] = torch.exp(dt[:, t, h] * A[h])[:, None, None] * S[:, h] + dt[
                :, t, h, None, None
            ] * torch.einsum("bn,bp->bnp", B[:, t, grp], x[:, t, h])
            y[:, t, h] = torch.einsum("bn,bnp->bp", C[:, t, grp], S[:, h]) + D[h] * x[:, t, h]
    return y, S


def run(x, dt, A, B, C, D, h0, **kwargs):
    return mamba2_ssd(
        x, dt, A, B, C, D=D, initial_state=h0, output_final_state=True, backend="torch", **kwargs
    )


SHAPES = [
    (2, 50, 4, 5, 2, 6, 16),
    (1, 64, 2, 3, 1, 4, 16),
    (2, 9, 4, 3, 4, 2, 16),
]  # Bt, T, H, P, G, N, chunk


@pytest.mark.parametrize("initial_state", [False, True], ids=["h0-none", "h0"])
@pytest.mark.parametrize(
    ("Bt", "T", "H", "P", "G", "N", "chunk"),
    SHAPES,
    ids=[f"B{s[0]}-T{s[1]}-H{s[2]}-P{s[3]}-G{s[4]}-N{s[5]}-C{s[6]}" for s in SHAPES],
)
def test_chunk_and_naive_match_hand_recurrence(initial_state, Bt, T, H, P, G, N, chunk):
    inputs = ssd_inputs(Bt, T, H, P, G, N, initial_state=initial_state, seed=T)
    y_ref, s_ref = ssd_by_hand(*inputs)
    leaves = [None if t is None else t.clone().requires_grad_() for t in inputs]
    results = {}
    for mode in ("recurrent", "chunk"):
        y, state = run(*leaves, mode=mode, chunk_size=chunk)
        assert relative_error(y, y_ref) < TIGHT and relative_error(state, s_ref) < TIGHT, mode
        gen = torch.Generator().manual_seed(5)
        dy, ds = (
            torch.randn(y.shape, generator=gen, dtype=y.dtype),
            torch.randn(state.shape, generator=gen, dtype=y.dtype),
        )
        results[mode] = torch.autograd.grad(
            (y * dy).sum() + (state * ds).sum(), [t for t in leaves if t is not None]
        )
    for name, a, b in zip(
        ("dx", "ddt", "dA", "dB", "dC", "dD", "dh0"), results["chunk"], results["recurrent"], strict=False
    ):
        assert relative_error(a, b) < TIGHT, name


def test_matches_fla_simple_gla_naive():
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    x, dt, A, B, C, D, h0 = ssd_inputs(2, 40, 4, 8, 2, 16, initial_state=True)
    y, state = run(x, dt, A, B, C, D, h0, mode="chunk", chunk_size=16)
    q, k = C.repeat_interleave(2, dim=2), B.repeat_interleave(2, dim=2)
    ref, ref_state = naive_recurrent_simple_gla(
        q, k, x * dt[..., None], dt * A, scale=1.0, initial_state=h0.float(), output_final_state=True
    )
    assert relative_error(y, ref + D[:, None] * x) < 1e-5
    assert relative_error(state, ref_state) < 1e-5


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_packed_matches_separate(mode):
    cu_seqlens = [0, 5, 37, 38, 70]
    n_seq = len(cu_seqlens) - 1
    x, dt, A, B, C, D, h0 = ssd_inputs(1, cu_seqlens[-1], 4, 3, 2, 5, initial_state=True, N_seq=n_seq)
    y, state = run(x, dt, A, B, C, D, h0, mode=mode, chunk_size=16, cu_seqlens=torch.tensor(cu_seqlens))
    for n in range(n_seq):
        s, e = cu_seqlens[n], cu_seqlens[n + 1]
        y_n, state_n = run(x[:, s:e], dt[:, s:e], A, B[:, s:e], C[:, s:e], D, h0[n : n + 1], mode=mode)
        assert relative_error(y[:, s:e], y_n) < TIGHT and relative_error(state[n : n + 1], state_n) < TIGHT


def test_chunk_gradcheck():
    inputs = ssd_inputs(1, 7, 2, 2, 1, 3, initial_state=True, seed=1)
    leaves = [t.clone().requires_grad_() for t in inputs]
    # fast_mode: v^T J u for random u, v instead of every Jacobian entry (a wrong gradient still fails it)
    assert torch.autograd.gradcheck(
        lambda *t: run(*t, mode="chunk", chunk_size=4), leaves, eps=1e-6, atol=1e-7, fast_mode=True
    )


def test_decode_continues_prefill_and_keeps_dtypes():
    x, dt, A, B, C, D, _ = ssd_inputs(2, 24, 4, 4, 2, 8)
    full, full_state = run(x, dt, A, B, C, D, None, mode="chunk", chunk_size=8)
    y, state = run(x[:, :20], dt[:, :20], A, B[:, :20], C[:, :20], D, None, mode="chunk", chunk_size=8)
    outs = [y]
    with torch.no_grad():
        for t in range(20, 24):
            y, state = run(x[:, t : t + 1], dt[:, t : t + 1], A, B[:, t : t + 1], C[:, t : t + 1], D, state)
            outs.append(y)
    assert relative_error(torch.cat(outs, 1), full) < TIGHT and relative_error(state, full_state) < TIGHT
    y16, s16 = run(*(t.to(torch.bfloat16) for t in (x, dt, A, B, C, D)), None)
    assert y16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    assert relative_error(y16, full) < 2e-2


def test_bad_shapes_raise_clear_errors():
    x, dt, A, B, C, D, _ = ssd_inputs(1, 10, 4, 4, 2, 8)
    with pytest.raises(ValueError, match="multiple of G"):
        mamba2_ssd(x, dt, A, B[:, :, :1].expand(1, 10, 3, 8), C[:, :, :1].expand(1, 10, 3, 8))
    with pytest.raises(ValueError, match=r"dt must have shape \[B, T, H\]"):
        mamba2_ssd(x, dt[..., :2], A, B, C)
    with pytest.raises(ValueError, match=r"A and D must have shape \[H\] = \[4\]"):
        mamba2_ssd(x, dt, A, B, C, D=D[:2])
    with pytest.raises(ValueError, match=r"initial_state must have shape \[1, 4, 8, 4\]"):
        mamba2_ssd(x, dt, A, B, C, initial_state=torch.zeros(1, 4, 4, 8))


def step_inputs(Bt=3, H=8, P=24, G=2, N=20, seed=0):
    """One decode token: x [B, H, P], raw dt [B, H], A [H], B/C [B, G, N], dt_bias, D [H], a state, float64."""
    x, _, A, B, C, D, h0 = ssd_inputs(Bt, 1, H, P, G, N, initial_state=True, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    dt_raw = torch.randn(Bt, H, generator=gen, dtype=torch.float64) * 3  # beyond softplus's threshold too
    dt_raw[0, 0] = 25.0
    dt_bias = torch.randn(H, generator=gen, dtype=torch.float64)
    return x[:, 0], dt_raw, A, B[:, 0], C[:, 0], dt_bias, D, h0


def test_step_is_one_token_of_the_scan_and_pads_keep_the_state():
    x, dt_raw, A, B, C, dt_bias, D, h0 = step_inputs()
    step = torch.nn.functional.softplus(dt_raw + dt_bias)  # [B, H]
    y_ref, s_ref = ssd_by_hand(x[:, None], step[:, None], A, B[:, None], C[:, None], D, h0)
    y, state = mamba2_ssd_step(x, dt_raw, A, B, C, dt_bias=dt_bias, D=D, state=h0, backend="torch")
    assert relative_error(y, y_ref[:, 0]) < TIGHT and relative_error(state, s_ref) < TIGHT
    mask = torch.tensor([True, False, True])
    y, state = mamba2_ssd_step(x, dt_raw, A, B, C, dt_bias=dt_bias, D=D, state=h0, mask=mask, backend="torch")
    assert torch.equal(state[1], h0[1]) and relative_error(state[0], s_ref[0]) < TIGHT
    y0, s0 = mamba2_ssd_step(x, dt_raw, A, B, C, dt_bias=dt_bias, backend="torch")  # no state: zeros, no D
    y_zero, s_zero = ssd_by_hand(x[:, None], step[:, None], A, B[:, None], C[:, None], D * 0, None)
    assert relative_error(y0, y_zero[:, 0]) < TIGHT and relative_error(s0, s_zero) < TIGHT
    with pytest.raises(ValueError, match=r"needs dt \[B, H\], B and C \[B, G, N\] with H a multiple of G"):
        mamba2_ssd_step(x, dt_raw[:, :2], A, B, C, dt_bias=dt_bias)
    with pytest.raises(ValueError, match=r"state must have shape \[3, 8, 20, 24\]"):
        mamba2_ssd_step(x, dt_raw, A, B, C, dt_bias=dt_bias, state=h0.transpose(-1, -2))
