"""causal_conv1d and rms_norm_gated torch references against direct formulas, FLA's cache layout and FLA's
plain-torch norm reference. float64 on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zebra_kernels import causal_conv1d, causal_conv1d_step_, rms_norm, rms_norm_gated, swiglu_linear
from zebra_kernels.testing import relative_error


def conv_inputs(B, T, C, W, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    weight = torch.randn(C, W, generator=gen, dtype=torch.float64)
    bias = torch.randn(C, generator=gen, dtype=torch.float64)
    return x, weight, bias


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize(
    ("B", "T", "C", "W"),
    [(2, 20, 6, 4), (1, 3, 4, 4), (2, 7, 3, 2)],
    ids=["B2-T20-C6-W4", "B1-T3-C4-W4", "B2-T7-C3-W2"],
)
def test_conv_equals_left_padded_conv1d(activation, B, T, C, W):
    x, weight, bias = conv_inputs(B, T, C, W)
    y, state = causal_conv1d(x, weight, bias, activation=activation, output_final_state=True, backend="torch")
    ref = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), weight[:, None, :], bias, groups=C).transpose(1, 2)
    ref = F.silu(ref) if activation else ref
    assert relative_error(y, ref) < 1e-14
    # FLA's cache layout: the last W raw inputs, oldest first, zeros before t = 0
    history = torch.cat([torch.zeros(B, W, C, dtype=x.dtype), x], dim=1)[:, -W:]  # [B, W, C]
    assert torch.equal(state, history.transpose(1, 2))


def fla_style_decode_step(x_t, cache, weight, bias):
    """What FLA's causal_conv1d_update does to a [N, C, W] cache: roll left, append x_t, y = sum(cache * w)."""
    cache = torch.cat([cache[..., 1:], x_t[:, :, None]], dim=-1)
    return F.silu((cache * weight).sum(-1) + bias), cache


def test_token_steps_equal_full_pass_and_follow_fla_cache_rules():
    x, weight, bias = conv_inputs(2, 12, 5, 4)
    full, full_state = causal_conv1d(x, weight, bias, output_final_state=True, backend="torch")
    y, state = causal_conv1d(x[:, :5], weight, bias, output_final_state=True, backend="torch")
    outs, fla_cache = [y], state.clone()
    for t in range(5, 12):
        y, state = causal_conv1d(x[:, t : t + 1], weight, bias, initial_state=state, output_final_state=True)
        y_fla, fla_cache = fla_style_decode_step(x[:, t], fla_cache, weight, bias)
        assert torch.allclose(y[:, 0], y_fla, rtol=0, atol=1e-14) and torch.equal(state, fla_cache)
        outs.append(y)
    assert relative_error(torch.cat(outs, 1), full) < 1e-14 and torch.equal(state, full_state)


def test_short_chunk_state_keeps_the_older_inputs():
    """A chunk shorter than W shifts the cache: the state holds the tail of the old cache then the new inputs."""
    x, weight, bias = conv_inputs(1, 6, 3, 4)
    _, state = causal_conv1d(x[:, :4], weight, bias, output_final_state=True)
    _, state = causal_conv1d(x[:, 4:], weight, bias, initial_state=state, output_final_state=True)
    assert torch.equal(state, x[:, 2:].transpose(1, 2))


def test_packed_conv_does_not_leak_across_sequences():
    cu_seqlens = [0, 2, 9, 10, 16]
    x, weight, bias = conv_inputs(1, 16, 4, 4, seed=1)
    gen = torch.Generator().manual_seed(2)
    h0 = torch.randn(4, 4, 4, generator=gen, dtype=torch.float64)
    x.requires_grad_()
    y, state = causal_conv1d(
        x, weight, bias, initial_state=h0, output_final_state=True, cu_seqlens=torch.tensor(cu_seqlens)
    )
    (dx,) = torch.autograd.grad(y[:, 2:9].sum(), x)  # outputs of sequence 1 depend only on its own inputs
    assert dx[:, :2].abs().max() == 0 and dx[:, 9:].abs().max() == 0 and dx[:, 2:9].abs().min() > 0
    for n in range(4):
        s, e = cu_seqlens[n], cu_seqlens[n + 1]
        y_n, state_n = causal_conv1d(
            x[:, s:e], weight, bias, initial_state=h0[n : n + 1], output_final_state=True
        )
        assert relative_error(y[:, s:e], y_n) < 1e-14 and torch.equal(state[n : n + 1], state_n)


def test_conv_gradcheck_and_dtypes():
    x, weight, bias = conv_inputs(1, 5, 2, 3)
    h0 = torch.randn(1, 2, 3, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias, h0)]
    assert torch.autograd.gradcheck(
        lambda a, w, b, h: causal_conv1d(a, w, b, initial_state=h, output_final_state=True), leaves
    )
    y, state = causal_conv1d(x.bfloat16(), weight.bfloat16(), output_final_state=True)
    assert y.dtype == torch.bfloat16 and state.dtype == torch.float32


def norm_inputs(C=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x, gate = (
        torch.randn(2, 7, C, generator=gen, dtype=torch.float64),
        torch.randn(2, 7, C, generator=gen, dtype=torch.float64),
    )
    return x, gate, torch.rand(C, generator=gen, dtype=torch.float64) + 0.5


@pytest.mark.parametrize("activation", ["swish", "sigmoid"])
def test_norm_before_gate_formula(activation):
    x, gate, weight = norm_inputs()
    act = F.silu if activation == "swish" else torch.sigmoid
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight * act(gate)
    y = rms_norm_gated(x, gate, weight, eps=1e-5, activation=activation, backend="torch")
    assert relative_error(y, expected) < 1e-14


@pytest.mark.parametrize("group_size", [None, 4, 16], ids=lambda g: f"group{g}")
def test_gate_before_norm_matches_fla_reference(group_size):
    """Mamba2's RMSNormGated (norm_before_gate=False) against FLA's plain-torch `rms_norm_ref`."""
    from fla.modules.norm.layernorm_gated import rms_norm_ref

    x, gate, weight = norm_inputs()
    y = rms_norm_gated(
        x, gate, weight, eps=1e-5, norm_before_gate=False, group_size=group_size, backend="torch"
    )
    ref = rms_norm_ref(
        x, weight, None, z=gate, eps=1e-5, group_size=group_size, norm_before_gate=False, upcast=False
    )
    assert relative_error(y, ref) < 1e-6  # rms_norm_ref casts the weight to float32
    xg = (x * F.silu(gate)).unflatten(-1, (-1, group_size or 16))
    expected = (xg / torch.sqrt(xg.pow(2).mean(-1, keepdim=True) + 1e-5)).flatten(-2) * weight
    assert relative_error(y, expected) < 1e-14


def test_grouped_norm_before_gate_and_dtype():
    x, gate, weight = norm_inputs()
    y = rms_norm_gated(x, gate, weight, eps=1e-6, group_size=8, activation="sigmoid")
    xg = x.unflatten(-1, (2, 8))
    expected = (
        (xg / torch.sqrt(xg.pow(2).mean(-1, keepdim=True) + 1e-6)).flatten(-2) * weight * torch.sigmoid(gate)
    )
    assert relative_error(y, expected) < 1e-14
    y16 = rms_norm_gated(
        x.bfloat16(), gate.bfloat16(), weight.float(), eps=1e-6, group_size=8, activation="sigmoid"
    )
    assert y16.dtype == torch.bfloat16 and relative_error(y16, expected) < 1e-2


def test_rms_norm_with_fused_residual_equals_add_then_norm_and_matches_fla_reference():
    from fla.modules.norm.layernorm import rms_norm_ref

    x, residual, weight = norm_inputs()
    y, stream = rms_norm(x, weight, eps=1e-6, residual=residual, prenorm=True, backend="torch")
    s = x + residual
    assert torch.equal(stream, s)
    expected = s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    assert relative_error(y, expected) < 1e-14
    ref = rms_norm_ref(x, weight, None, residual=residual, eps=1e-6, upcast=False)  # FLA's plain-torch form
    assert relative_error(y, ref) < 1e-14
    alone, first_stream = rms_norm(x, weight, eps=1e-6, prenorm=True)  # no residual: the stream is x
    assert first_stream is x and torch.equal(alone, rms_norm(x, weight, eps=1e-6))


def test_rms_norm_mixed_dtypes_follow_the_fused_kernel():
    """bf16 x with a float32 stream (autocast training): y in x's dtype, the sum kept in float32, one rounding."""
    x, residual, weight = norm_inputs()
    y, stream = rms_norm(x.bfloat16(), weight.float(), eps=1e-6, residual=residual.float(), prenorm=True)
    assert y.dtype == torch.bfloat16 and stream.dtype == torch.float32
    s = x.bfloat16().double() + residual.float().double()
    assert relative_error(stream, s) < 1e-7
    expected = s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    assert relative_error(y, expected) < 4e-3


def test_rms_norm_gradients():
    x, residual, weight = (t.requires_grad_() for t in norm_inputs())
    torch.autograd.gradcheck(
        lambda a, b, w: rms_norm(a, w, eps=1e-6, residual=b, prenorm=True, backend="torch"),
        (x, residual, weight),
    )


def test_swiglu_linear_formula_and_gradients():
    gen = torch.Generator().manual_seed(3)
    gate, up = (
        torch.randn(2, 5, 12, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    weight = torch.randn(7, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    y = swiglu_linear(gate, up, weight, bias, backend="torch")
    expected = (gate * torch.sigmoid(gate) * up) @ weight.T + bias
    assert y.shape == (2, 5, 7) and relative_error(y, expected) < 1e-14
    torch.autograd.gradcheck(lambda *a: swiglu_linear(*a, backend="torch"), (gate, up, weight, bias))
    with pytest.raises(ValueError, match=r"weight must have shape \[D, 12\]"):
        swiglu_linear(gate, up, weight.T)


def test_bad_arguments_raise_clear_errors():
    x, gate, weight = norm_inputs()
    with pytest.raises(ValueError, match="group_size must divide C=16"):
        rms_norm_gated(x, gate, weight, eps=1e-6, group_size=5)
    with pytest.raises(ValueError, match="activation must be one of"):
        rms_norm_gated(x, gate, weight, eps=1e-6, activation="relu")
    with pytest.raises(ValueError, match=r"residual must have x's shape \[2, 7, 16\]"):
        rms_norm(x, weight, eps=1e-6, residual=gate[:, :3])
    xc, wc, _ = conv_inputs(1, 4, 3, 4)
    with pytest.raises(ValueError, match=r"weight must have shape \[C, W\] with C=3"):
        causal_conv1d(xc, wc[:2])
    with pytest.raises(ValueError, match=r"initial_state must have shape \[1, 3, 4\]"):
        causal_conv1d(xc, wc, initial_state=torch.zeros(1, 4, 3))


def test_the_final_state_keeps_the_initial_states_dtype():
    """A bf16 cache stays bf16 (its values are raw bf16 inputs: nothing to lose, no cast per decode step); a
    float32 one stays float32; without an initial state the state is float32."""
    x, weight, _ = conv_inputs(2, 3, 4, 3)
    x, weight = x.bfloat16(), weight.bfloat16()
    _, state = causal_conv1d(x[:, :2], weight, output_final_state=True)
    assert state.dtype == torch.float32
    y32, s32 = causal_conv1d(x[:, 2:], weight, initial_state=state, output_final_state=True)
    y16, s16 = causal_conv1d(x[:, 2:], weight, initial_state=state.bfloat16(), output_final_state=True)
    assert s32.dtype == torch.float32 and s16.dtype == torch.bfloat16
    assert torch.equal(s16.float(), s32) and torch.equal(y16, y32)


def test_in_place_step_equals_the_scan_step_and_feed_false_keeps_the_state():
    """`causal_conv1d_step_` (a static cache's decode token) == `causal_conv1d` for one token with a state; the
    state buffer itself is rolled, and not at all when `feed` is False."""
    gen = torch.Generator().manual_seed(3)
    x, weight, bias = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((3, 1, 6), (6, 4), (6,)))
    state = torch.randn(3, 6, 4, generator=gen, dtype=torch.float64)
    y_ref, state_ref = causal_conv1d(
        x, weight, bias, initial_state=state, output_final_state=True, backend="torch"
    )
    buffer = state.clone()
    y = causal_conv1d_step_(x[:, 0], weight, bias, state=buffer, backend="torch")
    assert relative_error(y, y_ref[:, 0]) < 1e-12 and torch.equal(buffer, state_ref)
    for feed, want in ((torch.tensor(False), state), (torch.tensor(True), state_ref)):
        buffer = state.clone()
        y = causal_conv1d_step_(
            x[:, 0], weight, bias, state=buffer, feed=feed, activation=None, backend="torch"
        )
        assert torch.equal(buffer, want) and y.shape == (3, 6)
    with pytest.raises(ValueError, match=r"state must have shape \[3, 6, 4\]"):
        causal_conv1d_step_(x[:, 0], weight, bias, state=state[:, :, :3], backend="torch")
