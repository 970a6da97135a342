"""GDN and KDA torch references: chunk == naive (values, states, gradients), packed == separate sequences,
agreement with FLA's own naive references, gradcheck of the chunk forms, gates and dtypes. float64 on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zebra_kernels import gated_delta_rule, gdn_gate, kda_gate, kimi_delta_rule
from zebra_kernels._common import l2norm
from zebra_kernels.testing import gdn_inputs, kda_inputs, relative_error

TIGHT = 1e-10  # float64 chunk vs naive: only rounding differs


def make_inputs(op, B, T, H, HV, K, V, **kwargs):
    if op == "gdn":
        return gdn_inputs(B, T, H, HV, K, V, **kwargs)
    return kda_inputs(B, T, H, K, V, HV=HV, **kwargs)


def run(op, q, k, v, g, beta, h0, **kwargs):
    fn = gated_delta_rule if op == "gdn" else kimi_delta_rule
    return fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, backend="torch", **kwargs)


def outputs_and_grads(op, inputs, **kwargs):
    """Forward with output_final_state, then grads of a fixed random projection w.r.t. every input."""
    inputs = [None if x is None else x.detach().clone().requires_grad_() for x in inputs]
    o, state = run(op, *inputs, **kwargs)
    gen = torch.Generator().manual_seed(123)
    do = torch.randn(o.shape, generator=gen, dtype=o.dtype)
    dstate = torch.randn(state.shape, generator=gen, dtype=state.dtype)
    leaves = [x for x in inputs if x is not None]
    grads = torch.autograd.grad((o * do).sum() + (state * dstate).sum(), leaves)
    return o.detach(), state.detach(), grads


def assert_all_close(a, b, tol, names=("o", "state")):
    assert len(a) == len(b)
    for name, x, y in zip(names, a, b, strict=False):
        assert relative_error(x, y) < tol, f"{name}: relative error {relative_error(x, y):.2e}"


GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
SHAPES = [  # B, T, H, HV, K, V, chunk
    (2, 50, 2, 2, 8, 6, 16),  # T not a multiple of the chunk
    (1, 64, 1, 1, 4, 4, 16),  # exact multiple
    (2, 37, 2, 4, 8, 5, 8),  # grouped value heads
    (1, 5, 1, 2, 4, 3, 16),  # shorter than one chunk
]


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("initial_state", [False, True], ids=["h0-none", "h0"])
@pytest.mark.parametrize(
    ("B", "T", "H", "HV", "K", "V", "chunk"),
    SHAPES,
    ids=[f"B{s[0]}-T{s[1]}-H{s[2]}-HV{s[3]}-K{s[4]}-V{s[5]}-C{s[6]}" for s in SHAPES],
)
def test_chunk_matches_naive(op, initial_state, B, T, H, HV, K, V, chunk):
    inputs = make_inputs(op, B, T, H, HV, K, V, initial_state=initial_state, seed=T)
    o_r, s_r, g_r = outputs_and_grads(op, inputs, mode="recurrent")
    o_c, s_c, g_c = outputs_and_grads(op, inputs, mode="chunk", chunk_size=chunk)
    assert o_r.shape == (B, T, HV, V) and s_r.shape == (B, HV, K, V)
    assert_all_close((o_c, s_c), (o_r, s_r), TIGHT)
    assert_all_close(g_c, g_r, TIGHT, GRAD_NAMES)


CU_SEQLENS = [[0, 7, 40, 41, 90], [0, 16, 32]]


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("cu_seqlens", CU_SEQLENS, ids=lambda c: "cu" + "-".join(map(str, c)))
def test_packed_matches_separate(op, mode, cu_seqlens):
    T, N = cu_seqlens[-1], len(cu_seqlens) - 1
    inputs = make_inputs(op, 1, T, 2, 4, 8, 6, initial_state=True, N=N, seed=N)
    cu = torch.tensor(cu_seqlens)
    packed = outputs_and_grads(op, inputs, mode=mode, chunk_size=16, cu_seqlens=cu)

    def separate(q, k, v, g, beta, h0):
        outs, states = [], []
        for n in range(N):
            s, e = cu_seqlens[n], cu_seqlens[n + 1]
            o, state = run(
                op,
                q[:, s:e],
                k[:, s:e],
                v[:, s:e],
                g[:, s:e],
                beta[:, s:e],
                h0[n : n + 1],
                mode=mode,
                chunk_size=16,
            )
            outs.append(o)
            states.append(state)
        return torch.cat(outs, 1), torch.cat(states, 0)

    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    o, state = separate(*leaves)
    gen = torch.Generator().manual_seed(123)
    do, dstate = (
        torch.randn(o.shape, generator=gen, dtype=o.dtype),
        torch.randn(state.shape, generator=gen, dtype=o.dtype),
    )
    grads = torch.autograd.grad((o * do).sum() + (state * dstate).sum(), leaves)
    assert_all_close(packed[:2], (o, state), TIGHT)
    assert_all_close(packed[2], grads, TIGHT, GRAD_NAMES)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("HV", [2, 4], ids=lambda hv: f"H2-HV{hv}")
def test_gdn_matches_fla_naive(mode, HV):
    from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule, naive_recurrent_gated_delta_rule

    q, k, v, g, beta, h0 = gdn_inputs(2, 45, 2, HV, 16, 8, initial_state=True)
    o, state = gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, mode=mode, backend="torch"
    )
    # FLA's naive references take normalised, per-value-head q/k, compute in float32; note (beta, g) order
    qn, kn = (l2norm(x).repeat_interleave(HV // 2, dim=2) for x in (q, k))
    o_rec, s_rec = naive_recurrent_gated_delta_rule(
        qn, kn, v, beta, g, initial_state=h0, output_final_state=True
    )
    o_chk, s_chk = naive_chunk_gated_delta_rule(
        qn, kn, v, g, beta, chunk_size=16, initial_state=h0, output_final_state=True
    )
    for ref_o, ref_s in ((o_rec, s_rec), (o_chk, s_chk)):
        assert relative_error(o, ref_o) < 1e-5 and relative_error(state, ref_s) < 1e-5


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("HV", [2, 4], ids=lambda hv: f"H2-HV{hv}")
def test_kda_matches_fla_naive(mode, HV):
    from fla.ops.kda.naive import naive_chunk_kda, naive_recurrent_kda

    q, k, v, g, beta, h0 = kda_inputs(2, 48, 2, 16, 8, HV=HV, initial_state=True)
    o, state = kimi_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, mode=mode, backend="torch"
    )
    qn, kn = l2norm(q), l2norm(k)  # FLA's KDA naive references repeat q/k over value heads themselves
    o_rec, s_rec = naive_recurrent_kda(qn, kn, v, g, beta, initial_state=h0.float(), output_final_state=True)
    o_chk, s_chk = naive_chunk_kda(
        qn, kn, v, g, beta, initial_state=h0.float(), output_final_state=True, chunk_size=16
    )
    for ref_o, ref_s in ((o_rec, s_rec), (o_chk, s_chk)):
        assert relative_error(o, ref_o) < 1e-5 and relative_error(state, ref_s) < 1e-5


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_chunk_gradcheck(op):
    inputs = make_inputs(op, 1, 7, 1, 2, 3, 2, initial_state=True, seed=3)
    leaves = [x.detach().clone().requires_grad_() for x in inputs]

    def fn(*xs):
        return run(op, *xs, mode="chunk", chunk_size=4)

    # fast_mode: v^T J u for random u, v instead of every Jacobian entry (a wrong gradient still fails it;
    # 0.25 s instead of 3.9 s of CPU)
    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, fast_mode=True)


def test_gates_match_fla():
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    from fla.ops.kda.gate import naive_kda_gate

    gen = torch.Generator().manual_seed(0)
    a, A_log, dt_bias = (
        torch.randn(2, 9, 4, generator=gen),
        torch.rand(4, generator=gen) * 3,
        torch.randn(4, generator=gen),
    )
    assert torch.allclose(gdn_gate(a, A_log, dt_bias), naive_gdn_gate(a, A_log, dt_bias))
    f, dt_bias_k = torch.randn(2, 9, 4, 8, generator=gen), torch.randn(32, generator=gen)
    assert torch.allclose(kda_gate(f, A_log, dt_bias_k), naive_kda_gate(f, A_log, dt_bias_k))


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_gate_in_kernel_equals_precomputed_gate(op):
    q, k, v, raw, beta, h0 = make_inputs(op, 1, 20, 2, 2, 4, 4, initial_state=True)
    gen = torch.Generator().manual_seed(1)
    A_log = torch.rand(2, generator=gen, dtype=torch.float64) * 2
    dt_bias = torch.randn(2 if op == "gdn" else 8, generator=gen, dtype=torch.float64)
    gate = gdn_gate(raw, A_log, dt_bias) if op == "gdn" else kda_gate(raw, A_log, dt_bias)
    fused = run(op, q, k, v, raw, beta, h0, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    plain = run(op, q, k, v, gate, beta, h0)
    assert_all_close(fused, plain, TIGHT)


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_token_by_token_decode_continues_prefill(op):
    """Prefill 30 tokens (chunk), then decode 10 one at a time from the state == one pass over 40 tokens."""
    q, k, v, g, beta, _ = make_inputs(op, 2, 40, 2, 4, 8, 4)
    full, full_state = run(op, q, k, v, g, beta, None, mode="chunk", chunk_size=16)
    outs, state = [], None
    o, state = run(
        op, q[:, :30], k[:, :30], v[:, :30], g[:, :30], beta[:, :30], None, mode="chunk", chunk_size=16
    )
    outs.append(o)
    for t in range(30, 40):
        with torch.no_grad():
            o, state = run(
                op,
                q[:, t : t + 1],
                k[:, t : t + 1],
                v[:, t : t + 1],
                g[:, t : t + 1],
                beta[:, t : t + 1],
                state,
            )
        outs.append(o)
    assert_all_close((torch.cat(outs, 1), state), (full, full_state), TIGHT)


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_low_precision_inputs_keep_dtype_and_float32_state(op, dtype):
    inputs = make_inputs(op, 1, 40, 2, 2, 8, 8, initial_state=True)
    ref_o, ref_s = run(op, *inputs)
    low = [x.to(dtype) for x in inputs[:5]] + [inputs[5].float()]
    o, state = run(op, *low)
    assert o.dtype == dtype and state.dtype == torch.float32
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert relative_error(o, ref_o) < tol and relative_error(state, ref_s) < tol


def test_bad_shapes_raise_clear_errors():
    q, k, v, g, beta, _ = gdn_inputs(2, 10, 2, 4, 8, 8)
    with pytest.raises(ValueError, match="HV a multiple of H"):
        gated_delta_rule(q, k, v[:, :, :3], g[..., :3], beta[..., :3])
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV\]"):
        gated_delta_rule(q, k, v, g[..., :2], beta)
    with pytest.raises(ValueError, match="batch size must be 1"):
        gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 4, 10]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 4, 8, 8\]"):
        gated_delta_rule(q, k, v, g, beta, initial_state=torch.zeros(2, 2, 8, 8))
    q, k, v, g, beta, _ = kda_inputs(1, 10, 2, 8, 8)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV, K\]"):
        kimi_delta_rule(q, k, v, g[..., 0], beta)
    with pytest.raises(ValueError, match="use_gate_in_kernel=True needs A_log"):
        kimi_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0 and end at T=10"):
        kimi_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 4, 9]))


def test_l2norm_matches_fla_definition():
    """FLA normalises with x / sqrt(sum x^2 + 1e-6): differs from F.normalize for small vectors."""
    x = torch.tensor([[1e-4, 0.0], [3.0, 4.0]], dtype=torch.float64)
    expected = x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    assert torch.allclose(l2norm(x), expected, rtol=0, atol=1e-15)
    assert not torch.allclose(l2norm(x), F.normalize(x, dim=-1))


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("neg", [False, True], ids=["beta", "2beta"])
def test_beta_sigmoid_in_kernel_equals_precomputed_beta(op, neg):
    q, k, v, g, beta, h0 = make_inputs(op, 2, 20, 2, 2, 4, 4, initial_state=True)
    logits = torch.logit(beta.clamp(1e-3, 1 - 1e-3))  # [B, T, HV]
    precomputed = logits.sigmoid() * (2.0 if neg else 1.0)
    for mode in ("chunk", "recurrent"):
        fused = run(
            op, q, k, v, g, logits, h0, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg, mode=mode
        )
        assert_all_close(fused, run(op, q, k, v, g, precomputed, h0, mode=mode), TIGHT)
    with pytest.raises(ValueError, match="allow_neg_eigval=True needs use_beta_sigmoid_in_kernel"):
        run(op, q, k, v, g, beta, h0, allow_neg_eigval=True)
