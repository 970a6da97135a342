"""`zebra_kernels.gla.gated_linear_attention` on the torch backend: the definition in float64, FLA's own naive
form, packed sequences, decode continuing a prefill, gradients, low-precision inputs and bad shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zebra_kernels.gla import gated_linear_attention


def inputs(B=2, T=9, H=3, K=4, V=5, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, generator=gen, dtype=dtype) for d in (K, K, V))
    g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen, dtype=dtype) + 2)  # [B, T, H, K] log decay <= 0
    return q, k, v, g


def attention_form(q, k, v, g, scale):
    """o_t = sum_{s <= t} (q_t * exp(G_t - G_s)) . k_s v_s (G the cumulative log decay): the closed form."""
    G = g.cumsum(1)  # [B, T, H, K]
    T = q.shape[1]
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    for t in range(T):
        for s in range(t + 1):
            w = (q[:, t] * scale * (G[:, t] - G[:, s]).exp() * k[:, s]).sum(-1)  # [B, H]
            out[:, t] += w[..., None] * v[:, s]
    return out


def test_recurrence_equals_the_closed_form_in_float64():
    q, k, v, g = inputs()
    o, _ = gated_linear_attention(q, k, v, g, backend="torch")
    torch.testing.assert_close(o, attention_form(q, k, v, g, q.shape[-1] ** -0.5), rtol=1e-10, atol=1e-10)


def test_matches_fla_naive_reference():
    from fla.ops.gla.naive import naive_recurrent_gla

    q, k, v, g = inputs(dtype=torch.float32)
    h0 = torch.randn(2, 3, 4, 5)
    o, state = gated_linear_attention(q, k, v, g, initial_state=h0, output_final_state=True, backend="torch")
    ref_o, ref_state = naive_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, ref_state, rtol=1e-5, atol=1e-5)


def test_packed_sequences_restart_the_state():
    q, k, v, g = inputs(B=1, T=10)
    cu = torch.tensor([0, 3, 10])
    o, state = gated_linear_attention(q, k, v, g, cu_seqlens=cu, output_final_state=True, backend="torch")
    for n, (s, e) in enumerate(((0, 3), (3, 10))):
        part, final = gated_linear_attention(
            q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], output_final_state=True, backend="torch"
        )
        torch.testing.assert_close(o[:, s:e], part)
        torch.testing.assert_close(state[n : n + 1], final)


def test_token_by_token_decode_continues_prefill():
    q, k, v, g = inputs(T=8)
    full, _ = gated_linear_attention(q, k, v, g, backend="torch")
    out, state = gated_linear_attention(q[:, :5], k[:, :5], v[:, :5], g[:, :5], output_final_state=True)
    steps = [out]
    for t in range(5, 8):
        o, state = gated_linear_attention(
            q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[:, t : t + 1],
            initial_state=state, output_final_state=True, backend="torch",
        )  # fmt: skip
        steps.append(o)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_gradcheck():
    q, k, v, g = (x[:, :4, :2, :] for x in inputs(B=1, T=4, H=2, K=3, V=2))
    args = tuple(x.clone().requires_grad_() for x in (q, k, v, g))
    assert torch.autograd.gradcheck(lambda *a: gated_linear_attention(*a, backend="torch")[0], args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_low_precision_inputs_keep_dtype_and_float32_state(dtype):
    q, k, v, g = inputs(dtype=dtype)
    o, state = gated_linear_attention(q, k, v, g, output_final_state=True, backend="torch")
    assert o.dtype == dtype and state.dtype == torch.float32


def test_bad_shapes_raise_clear_errors():
    q, k, v, g = inputs()
    with pytest.raises(ValueError, match=r"q, k, g must be \[B, T, H, K\]"):
        gated_linear_attention(q, k, v, g[..., :2], backend="torch")
    with pytest.raises(ValueError, match="initial_state"):
        gated_linear_attention(q, k, v, g, initial_state=torch.zeros(2, 3, 4, 4), backend="torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_fla_backend_matches_the_float64_definition_on_gpu(mode):
    """FLA's chunk_gla / fused_recurrent_gla against the torch form in float64 on the same bf16-rounded inputs:
    outputs, final states and (chunk) gradients, over packed sequences with initial states."""
    B, T, H, K, V = 1, 300, 4, 64, 128
    q, k, v, g = (x.cuda() for x in inputs(B=B, T=T, H=H, K=K, V=V, dtype=torch.float32))
    h0 = torch.randn(3, H, K, V, device="cuda")
    cu = torch.tensor([0, 100, 171, 300], device="cuda")
    low = [x.to(torch.bfloat16) for x in (q, k, v)] + [g]  # as the layer passes them: the decay in float32
    grad = mode == "chunk"
    fla_in = [x.clone().requires_grad_(grad) for x in low]
    ref_in = [x.detach().double().requires_grad_(grad) for x in low]
    kwargs = dict(output_final_state=True, cu_seqlens=cu, mode=mode)
    with torch.set_grad_enabled(grad):
        o, s = gated_linear_attention(*fla_in, initial_state=h0, backend="fla", **kwargs)
        ro, rs = gated_linear_attention(*ref_in, initial_state=h0.double(), backend="torch", **kwargs)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()

    assert rel(o, ro) < 2e-2 and rel(s, rs) < 2e-2
    if grad:
        cotangent = torch.randn_like(ro)
        (o.double() * cotangent).sum().backward()
        (ro * cotangent).sum().backward()
        for name, a, b in zip("qkvg", fla_in, ref_in, strict=True):
            assert rel(a.grad, b.grad) < 2e-2, name
