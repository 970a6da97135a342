"""FLA backend vs the float64 torch reference on a GPU, forward and backward, at the 1B recipes' shapes.

Skipped without CUDA/ROCm and a working FLA. Inputs are bf16 for FLA (states float32); the reference runs in
float64 on the same (rounded) values; every relative error ||out - ref|| / ||ref|| must be < 2e-2 and finite.
With ZEBRA_GPU_REPORT=path.jsonl every measured error is appended as a JSON line (test, case, quantity, rel_err).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tests.conftest import gpu_report

import zebra_kernels as zk
from zebra_kernels.backend import fla_import_error, mamba_ssm_import_error
from zebra_kernels.testing import gdn_inputs, kda_inputs, relative_error, ssd_inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
    pytest.mark.skipif(
        torch.cuda.is_available() and fla_import_error() is not None, reason="needs a working FLA"
    ),
]

TOL = 2e-2
BF16, F32 = torch.bfloat16, torch.float32
# mamba2_ssd's inputs (x, dt, A, B, C, D, h0): their dtypes in a bf16 model and their names in reports.
SSD_DTYPES = [BF16, F32, F32, BF16, BF16, F32, F32]
SSD_NAMES = ["x", "dt", "A", "B", "C", "D", "h0"]


@pytest.fixture
def record(request):
    """record(case, quantity, rel_err): print, append to $ZEBRA_GPU_REPORT, assert the bound."""

    def _record(case: str, quantity: str, value: float) -> None:
        row = {"test": request.node.name, "case": case, "quantity": quantity, "rel_err": value}
        print(json.dumps(row))
        gpu_report("kernels", row)

    return _record


def compare(record, case, fn, inputs, fla_dtypes, names, backend="fla"):
    """Run fn(*inputs, backend=...) in float64 (torch) and in fla_dtypes on `backend`; compare outputs and
    grads."""
    # both sides see the same values: the reference runs on the bf16/fp32-rounded inputs upcast to float64,
    # so the measured error is the kernel's, not the input rounding's
    fla_leaves = [
        None if t is None else t.to(d).clone().requires_grad_()
        for t, d in zip(inputs, fla_dtypes, strict=True)
    ]
    ref_leaves = [None if t is None else t.detach().double().requires_grad_() for t in fla_leaves]
    ref_out, ref_state = fn(*ref_leaves, backend="torch")
    out, state = fn(*fla_leaves, backend=backend)
    gen = torch.Generator(device="cuda").manual_seed(7)  # cotangents rounded to FLA's output dtypes too
    d_out = torch.randn(ref_out.shape, generator=gen, device="cuda").to(out.dtype).double()
    d_state = None if state is None else torch.randn(state.shape, generator=gen, device="cuda").double()

    def grads(o, s, leaves):
        loss = (o * d_out.to(o.dtype)).sum() + (0 if s is None else (s * d_state.to(s.dtype)).sum())
        live = [t for t in leaves if t is not None]
        return dict(
            zip(
                [n for n, t in zip(names, leaves, strict=True) if t is not None],
                torch.autograd.grad(loss, live),
                strict=True,
            )
        )

    ref_grads, fla_grads = grads(ref_out, ref_state, ref_leaves), grads(out, state, fla_leaves)
    pairs = [("out", out, ref_out)] + ([("state", state, ref_state)] if ref_state is not None else [])
    pairs += [("d" + n, fla_grads[n], ref_grads[n]) for n in ref_grads]
    failures = []
    for quantity, got, want in pairs:
        err = relative_error(got, want) if torch.isfinite(got).all() else math.inf
        record(case, quantity, err)
        if not err < TOL:
            failures.append(f"{quantity}: {err:.3e}")
    assert not failures, f"{case}: relative error >= {TOL}: {', '.join(failures)}"


PACKED = [0, 1000, 2048, 2049, 4096]  # 4 sequences in one row of 4096 tokens, boundaries off the chunk grid
CASES = ["plain", "h0", "varlen-h0"]


def layout(case):
    """(batch, T, cu_seqlens, N) for a case at T=2048 per row."""
    if case == "varlen-h0":
        return 1, PACKED[-1], torch.tensor(PACKED, device="cuda"), len(PACKED) - 1
    return 2, 2048, None, 2


def raw_gate_and_beta(case, g, beta, heads, dt_bias_size):
    """For the in-kernel cases: (raw gate input, beta or its logits, kernel flags with A_log / dt_bias), as the
    mixers pass them without padding (FLA's layers do the same)."""
    if case not in ("gate-in-kernel", "beta-in-kernel"):
        return g, beta, {}
    gen = torch.Generator(device="cuda").manual_seed(3)
    g = torch.randn(g.shape, generator=gen, device="cuda", dtype=torch.float64)
    extra = dict(
        use_gate_in_kernel=True,
        A_log=torch.rand(heads, device="cuda").mul(2).log1p().double(),  # float32-exact values
        dt_bias=(torch.randn(dt_bias_size, device="cuda") * 0.5).double(),
    )
    if case == "beta-in-kernel":
        beta = torch.randn(beta.shape, generator=gen, device="cuda", dtype=torch.float64) * 2  # logits
        extra["use_beta_sigmoid_in_kernel"] = True
    return g, beta, extra


@pytest.mark.parametrize("case", [*CASES, "gate-in-kernel", "beta-in-kernel"])
def test_gdn_fla_matches_reference(record, case):
    B, T, cu, N = layout(case)
    q, k, v, g, beta, h0 = gdn_inputs(B, T, 8, 16, 64, 64, device="cuda", initial_state=case != "plain", N=N)
    g, beta, extra = raw_gate_and_beta(case, g, beta, 16, 16)

    def fn(q, k, v, g, beta, h0, backend):
        ex = {
            key: (val.float() if backend == "fla" else val) if torch.is_tensor(val) else val
            for key, val in extra.items()
        }
        return zk.gated_delta_rule(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, backend=backend, **ex
        )

    compare(
        record,
        f"gdn-B{B}-T{T}-H8-HV16-K64-V64-{case}",
        fn,
        [q, k, v, g, beta, h0],
        [BF16, BF16, BF16, F32, BF16, F32],
        ["q", "k", "v", "g", "beta", "h0"],
    )


@pytest.mark.parametrize("case", [*CASES, "beta-in-kernel"])
def test_kda_fla_matches_reference(record, case):
    B, T, cu, N = layout(case)
    q, k, v, g, beta, h0 = kda_inputs(B, T, 16, 32, 64, device="cuda", initial_state=case != "plain", N=N)
    g, beta, extra = raw_gate_and_beta(case, g, beta, 16, 16 * 32)

    def fn(q, k, v, g, beta, h0, backend):
        ex = {
            key: (val.float() if backend == "fla" else val) if torch.is_tensor(val) else val
            for key, val in extra.items()
        }
        return zk.kimi_delta_rule(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, backend=backend, **ex
        )

    compare(
        record,
        f"kda-B{B}-T{T}-H16-K32-V64-{case}",
        fn,
        [q, k, v, g, beta, h0],
        [BF16, BF16, BF16, F32, BF16, F32],
        ["q", "k", "v", "g", "beta", "h0"],
    )


@pytest.mark.parametrize("case", CASES)
def test_mamba2_fla_matches_reference(record, case):
    B, T, cu, N = layout(case)
    x, dt, A, Bm, C, D, h0 = ssd_inputs(
        B, T, 32, 64, 8, 64, device="cuda", initial_state=case != "plain", N_seq=N
    )

    def fn(x, dt, A, Bm, C, D, h0, backend):
        return zk.mamba2_ssd(
            x, dt, A, Bm, C, D=D, initial_state=h0, output_final_state=True, cu_seqlens=cu, backend=backend
        )

    compare(
        record,
        f"mamba2-B{B}-T{T}-H32-P64-G8-N64-{case}",
        fn,
        [x, dt, A, Bm, C, D, h0],
        SSD_DTYPES,
        SSD_NAMES,
    )


@pytest.mark.skipif(mamba_ssm_import_error() is not None, reason="needs mamba-ssm's SSD kernel")
@pytest.mark.parametrize("case", [*CASES, "varlen"])
def test_mamba2_mamba_ssm_matches_reference(record, case):
    """mamba-ssm's chunked scan (backend="mamba_ssm", mode chunk): plain and with initial states (final states
    returned), packed with initial states (the padded-batch path) and packed without states (`seq_idx`)."""
    B, T, cu, N = layout("varlen-h0" if case == "varlen" else case)
    x, dt, A, Bm, C, D, h0 = ssd_inputs(
        B, T, 32, 64, 8, 64, device="cuda", initial_state=case in ("h0", "varlen-h0"), N_seq=N
    )

    def fn(x, dt, A, Bm, C, D, h0, backend):
        return zk.mamba2_ssd(
            x, dt, A, Bm, C, D=D, initial_state=h0, output_final_state=case != "varlen", cu_seqlens=cu,
            mode="chunk", backend=backend,
        )  # fmt: skip

    compare(
        record,
        f"mamba2-mamba_ssm-B{B}-T{T}-H32-P64-G8-N64-{case}",
        fn,
        [x, dt, A, Bm, C, D, h0],
        SSD_DTYPES,
        SSD_NAMES,
        backend="mamba_ssm",
    )


@pytest.mark.parametrize("case", CASES)
def test_conv_fla_matches_reference(record, case):
    B, T, cu, N = layout(case)
    gen = torch.Generator(device="cuda").manual_seed(0)
    C, W = 3072, 4  # Mamba2 1B conv over x|B|C: 2048 + 2 * 8 * 64
    x = torch.randn(B, T, C, generator=gen, device="cuda", dtype=torch.float64)
    weight = torch.randn(C, W, generator=gen, device="cuda", dtype=torch.float64) * 0.5
    bias = torch.randn(C, generator=gen, device="cuda", dtype=torch.float64)
    h0 = torch.randn(N, C, W, generator=gen, device="cuda", dtype=torch.float64) if case != "plain" else None

    def fn(x, weight, bias, h0, backend):
        y, state = zk.causal_conv1d(
            x, weight, bias, initial_state=h0, output_final_state=True, cu_seqlens=cu, backend=backend
        )
        # state slot 0 (token T - W) is shifted out before the next token reads the state, so it never reaches
        # an output; FLA does not propagate a gradient into it. Compare the W - 1 live slots.
        return y, state[..., 1:]

    compare(
        record,
        f"conv-B{B}-T{T}-C{C}-W{W}-{case}",
        fn,
        [x, weight, bias, h0],
        [BF16, BF16, BF16, BF16],
        ["x", "weight", "bias", "h0"],
    )


def test_conv_states_interchange_between_backends(record):
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 70, 512, generator=gen, device="cuda").bfloat16()
    weight = torch.randn(512, 4, generator=gen, device="cuda").bfloat16()
    full, full_state = zk.causal_conv1d(x, weight, output_final_state=True, backend="torch")
    with torch.no_grad():
        for first, second in (("fla", "torch"), ("torch", "fla")):
            _, state = zk.causal_conv1d(x[:, :60], weight, output_final_state=True, backend=first)
            outs = []
            for t in range(60, 70):  # token-by-token decode (FLA: the in-place update kernel on a copy)
                y, state = zk.causal_conv1d(
                    x[:, t : t + 1], weight, initial_state=state, output_final_state=True, backend=second
                )
                outs.append(y)
            err = relative_error(torch.cat(outs, 1), full[:, 60:])
            record(f"conv-{first}-then-{second}", "decode-out", err)
            assert err < TOL and torch.equal(state, full_state)


@pytest.mark.parametrize(
    ("norm_before_gate", "group_size", "activation"),
    [
        (True, None, "swish"),
        (True, None, "sigmoid"),
        (False, 256, "swish"),
        (True, 16, "sigmoid"),
        (False, 256, "sigmoid"),
    ],
    ids=["gdn-o_norm", "kda-o_norm", "mamba2-norm", "grouped-then-gate", "sigmoid-then-grouped"],
)
def test_rms_norm_gated_fla_matches_reference(record, norm_before_gate, group_size, activation):
    gen = torch.Generator(device="cuda").manual_seed(2)
    shape = (2, 2048, 2048) if group_size == 256 else (2, 2048, 16, 64)
    x, gate = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float64) for _ in range(2))
    weight = torch.rand(shape[-1], generator=gen, device="cuda", dtype=torch.float64) + 0.5

    def fn(x, gate, weight, backend):
        y = zk.rms_norm_gated(
            x,
            gate,
            weight,
            eps=1e-5,
            activation=activation,
            norm_before_gate=norm_before_gate,
            group_size=group_size,
            backend=backend,
        )
        return y, None

    compare(
        record,
        f"norm-{'before' if norm_before_gate else 'after'}-gate-g{group_size}-{activation}",
        fn,
        [x, gate, weight],
        [BF16, BF16, F32],
        ["x", "gate", "weight"],
    )


def test_rms_norm_with_residual_fla_matches_reference(record):
    """The sublayer pre-norm at 1B width: a bf16 mixer output added to the float32 stream, then normed."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    x, residual = (
        torch.randn(2, 2048, 2048, generator=gen, device="cuda", dtype=torch.float64) for _ in "xr"
    )
    weight = torch.rand(2048, generator=gen, device="cuda", dtype=torch.float64) + 0.5

    def fn(x, residual, weight, backend):
        return zk.rms_norm(x, weight, eps=1e-6, residual=residual, prenorm=True, backend=backend)

    compare(
        record,
        "rms_norm-residual-D2048",
        fn,
        [x, residual, weight],
        [BF16, F32, F32],
        ["x", "residual", "weight"],
    )


def test_swiglu_linear_fla_matches_reference(record):
    """The MLP at 1B shapes (F = 8192 -> D = 2048)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    gate, up = (torch.randn(2, 2048, 8192, generator=gen, device="cuda", dtype=torch.float64) for _ in "gu")
    weight = torch.randn(2048, 8192, generator=gen, device="cuda", dtype=torch.float64) / 8192**0.5

    def fn(gate, up, weight, backend):
        return zk.swiglu_linear(gate, up, weight, backend=backend), None

    compare(
        record,
        "swiglu_linear-F8192-D2048",
        fn,
        [gate, up, weight],
        [BF16, BF16, BF16],
        ["gate", "up", "weight"],
    )


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("impl", ["fla", "torch"])
def test_linear_cross_entropy_matches_reference(record, impl, reduction):
    """The training loss at 1B shapes (N = 4 x 2048 tokens, D = 2048, V = 128256): bf16 hidden states and the
    float32 master weight under bf16 autocast, as the trainer runs it; both backends (torch is the fallback on a
    GPU where FLA is refused)."""
    N, D, V = 8192, 2048, 128256
    gen = torch.Generator(device="cuda").manual_seed(6)
    hidden = torch.randn(N, D, generator=gen, device="cuda", dtype=torch.float64)
    weight = torch.randn(V, D, generator=gen, device="cuda", dtype=torch.float64) * 0.02
    labels = torch.randint(0, V, (N,), generator=gen, device="cuda")
    labels[::7] = -100

    def fn(hidden, weight, backend):
        tested = backend == "fla"  # compare() calls the reference with backend="torch", in float64
        with torch.autocast("cuda", dtype=BF16, enabled=tested):
            loss = zk.linear_cross_entropy(
                hidden, weight, labels, reduction=reduction, backend=impl if tested else "torch"
            )
        return loss, None

    compare(record, f"linear_ce-{impl}-{reduction}-N{N}-D{D}-V{V}", fn, [hidden, weight], [BF16, F32],
            ["hidden", "weight"])  # fmt: skip


def rounded(tensors, dtypes):
    """(FLA inputs in `dtypes`, the same values in float64 for the reference)."""
    low = [t.to(d) for t, d in zip(tensors, dtypes, strict=True)]
    return low, [t.double() for t in low]


@pytest.mark.parametrize("T", [1, 16])
def test_recurrent_decode_kernels_match_reference(record, T):
    """mode='recurrent' (FLA's fused_recurrent kernels, inference) with a carried state."""
    delta_dtypes = [BF16, BF16, BF16, F32, BF16, F32]
    results = {}
    with torch.no_grad():
        for name, fn, inputs in (
            ("gdn", zk.gated_delta_rule, gdn_inputs(4, T, 8, 16, 64, 64, device="cuda", initial_state=True)),
            ("kda", zk.kimi_delta_rule, kda_inputs(4, T, 16, 32, 64, device="cuda", initial_state=True)),
        ):
            (q, k, v, g, beta, h0), ref = rounded(inputs, delta_dtypes)
            got = fn(
                q, k, v, g, beta, initial_state=h0, output_final_state=True, mode="recurrent", backend="fla"
            )
            want = fn(*ref[:5], initial_state=ref[5], output_final_state=True, backend="torch")
            results[name] = (got, want)
        inputs = ssd_inputs(4, T, 32, 64, 8, 64, device="cuda", initial_state=True)
        (x, dt, A, Bm, C, D, h0), ref = rounded(inputs, SSD_DTYPES)
        got = zk.mamba2_ssd(
            x, dt, A, Bm, C, D=D, initial_state=h0, output_final_state=True, mode="recurrent", backend="fla"
        )
        want = zk.mamba2_ssd(
            *ref[:5], D=ref[5], initial_state=ref[6], output_final_state=True, backend="torch"
        )
        results["mamba2"] = (got, want)
    for name, ((o, s), (ro, rs)) in results.items():
        for quantity, a, b in (("out", o, ro), ("state", s, rs)):
            err = relative_error(a, b) if torch.isfinite(a).all() else math.inf
            record(f"{name}-recurrent-T{T}", quantity, err)
            assert err < TOL, f"{name} {quantity}: {err:.3e}"


@pytest.mark.parametrize("neg", [False, True], ids=["beta", "2beta"])
@pytest.mark.parametrize("name", ["gdn", "kda"])
def test_recurrent_decode_with_the_gate_and_beta_in_the_kernel(record, name, neg):
    """The mixers' decode step: raw bf16 gate input and beta logits straight from the stacked projection, the
    gate, sigmoid (x2 with allow_neg_eigval) and decay inside FLA's fused recurrent kernel, a carried state."""
    if name == "gdn":
        fn, inputs, heads, dt_size = (
            zk.gated_delta_rule,
            gdn_inputs(4, 1, 8, 16, 64, 64, device="cuda", initial_state=True),
            16,
            16,
        )
    else:
        fn, inputs, heads, dt_size = (
            zk.kimi_delta_rule,
            kda_inputs(4, 1, 16, 32, 64, device="cuda", initial_state=True),
            16,
            512,
        )
    q, k, v, g, beta, h0 = inputs
    g, beta, extra = raw_gate_and_beta("beta-in-kernel", g, beta, heads, dt_size)
    extra["allow_neg_eigval"] = neg
    (q, k, v, g, beta, h0), ref = rounded([q, k, v, g, beta, h0], [BF16, BF16, BF16, BF16, BF16, F32])
    with torch.no_grad():
        low = {key: val.float() if torch.is_tensor(val) else val for key, val in extra.items()}
        o, s = fn(
            q,
            k,
            v,
            g,
            beta,
            initial_state=h0,
            output_final_state=True,
            mode="recurrent",
            backend="fla",
            **low,
        )
        ro, rs = fn(*ref[:5], initial_state=ref[5], output_final_state=True, backend="torch", **extra)
    for quantity, a, b in (("out", o, ro), ("state", s, rs)):
        err = relative_error(a, b) if torch.isfinite(a).all() else math.inf
        record(f"{name}-recurrent-in-kernel-{'2beta' if neg else 'beta'}", quantity, err)
        assert err < TOL, f"{name} {quantity}: {err:.3e}"


@pytest.mark.parametrize("batch", [1, 8])
def test_mamba2_decode_step_kernel_matches_reference(record, batch):
    """`mamba2_ssd_step`'s Triton kernel (the Mamba2 decode step of 1b-mamba-mla: H=32, P=64, G=8, N=64) on bf16
    x/B/C from the input projection's strided views, a raw dt, a carried float32 state and a pad row, against the
    float64 torch step on the same values."""
    H, P, G, N = 32, 64, 8, 64
    gen = torch.Generator(device="cuda").manual_seed(batch)
    proj = torch.randn(batch, H * P + 2 * G * N + H, generator=gen, device="cuda").to(BF16)
    x, Bm, C, dt = proj.split([H * P, G * N, G * N, H], dim=-1)
    x, Bm, C = x.view(batch, H, P), Bm.view(batch, G, N), C.view(batch, G, N)
    A = -torch.rand(H, generator=gen, device="cuda").mul(4).exp()
    dt_bias, D = (torch.randn(H, generator=gen, device="cuda") for _ in range(2))
    state = torch.randn(batch, H, N, P, generator=gen, device="cuda") * 0.5
    mask = torch.ones(batch, dtype=torch.bool, device="cuda")
    mask[0] = batch == 1  # a pad row at batch 8
    with torch.no_grad():
        y, s = zk.mamba2_ssd_step(x, dt, A, Bm, C, dt_bias=dt_bias, D=D, state=state, mask=mask)
        ry, rs = zk.mamba2_ssd_step(
            *(t.double() for t in (x, dt, A, Bm, C)), dt_bias=dt_bias.double(), D=D.double(),
            state=state.double(), mask=mask, backend="torch",
        )  # fmt: skip
    assert y.dtype == BF16 and s.dtype == F32
    for quantity, a, b in (("out", y, ry), ("state", s, rs)):
        err = relative_error(a, b) if torch.isfinite(a).all() else math.inf
        record(f"mamba2-step-B{batch}", quantity, err)
        assert err < TOL, f"{quantity}: {err:.3e}"
    if batch > 1:
        assert torch.equal(s[0], state[0])  # the pad row keeps its state


@pytest.mark.parametrize("feed", [True, False])
def test_conv_decode_step_kernel_matches_reference(record, feed):
    """`causal_conv1d_step_`'s Triton kernel (a static cache's decode token, rolling its bf16 state in place) on a
    strided bf16 view, at 1b-gdn-pure's 2,048 conv channels and batch 8, against the float64 conv step."""
    B, C, W = 8, 2048, 4
    gen = torch.Generator(device="cuda").manual_seed(int(feed))
    x = torch.randn(B, C + 64, generator=gen, device="cuda").to(BF16)[:, 32 : 32 + C]
    weight, bias = torch.randn(C, W, generator=gen, device="cuda").to(BF16), None
    state = torch.randn(B, C, W, generator=gen, device="cuda").to(BF16)
    buffer = state.clone()
    with torch.no_grad():
        y = zk.causal_conv1d_step_(x, weight, bias, state=buffer, feed=torch.tensor(feed, device="cuda"))
        ry, rs = zk.causal_conv1d(
            x.double()[:, None], weight.double(), initial_state=state.double(), output_final_state=True,
            backend="torch",
        )  # fmt: skip
    err = relative_error(y, ry[:, 0]) if torch.isfinite(y).all() else math.inf
    record(f"conv-step-feed{feed}", "out", err)
    assert err < TOL and y.dtype == BF16
    assert torch.equal(buffer, rs.to(BF16) if feed else state)  # raw inputs: rolled exactly, or kept


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize(
    "shape", ["mlp gate-up, norm", "mlp down", "mamba2 in, norm"], ids=["gate-up", "down", "mamba2-in"]
)
def test_decode_gemv_kernel_matches_reference(record, batch, shape):
    """`zebra_kernels.gemv` (the fused decode GEMVs, tuned on this GPU) at 1b-mamba-mla's shapes in bf16 against
    float64 on the same values: the MLP's gate and up with the pre-norm, residual add and SwiGLU inside, its down
    projection, Mamba2's input projection (5,152 rows) with the pre-norm and no residual (the first sublayer)."""
    D, F = 2048, 8192
    n, k, up, norm, residual = {
        "mlp gate-up, norm": (F, D, True, True, True),
        "mlp down": (D, F, False, False, False),
        "mamba2 in, norm": (2 * D + 2 * 8 * 64 + 32, D, False, True, False),  # z, x, B, C, dt
    }[shape]
    gen = torch.Generator(device="cuda").manual_seed(batch)
    x = torch.randn(batch, 1, k, generator=gen, device="cuda").to(BF16)
    w, w_up = (torch.randn(n, k, generator=gen, device="cuda").div(k**0.5).to(BF16) for _ in range(2))
    res = torch.randn(batch, 1, k, generator=gen, device="cuda").to(BF16) if residual else None
    norm_w = (torch.rand(k, generator=gen, device="cuda") + 0.5).to(BF16)
    with torch.no_grad():
        if norm:
            y, s = zk.rms_norm_linear(x, norm_w, w, eps=1e-6, residual=res, up_weight=w_up if up else None)
            rh, _ = zk.rms_norm(x.double(), norm_w.double(), eps=1e-6, residual=None if res is None else
                                 res.double(), prenorm=True, backend="torch")  # fmt: skip
        else:
            y, rh = zk.linear_rows(x, w, up_weight=w_up if up else None), x.double()
        ry = rh @ w.double().T
        if up:
            ry = torch.nn.functional.silu(ry) * (rh @ w_up.double().T)
    assert y.dtype == BF16 and y.shape == (batch, 1, n)
    err = relative_error(y, ry) if torch.isfinite(y).all() else math.inf
    record(f"gemv-{shape}-B{batch}", "out", err)
    assert err < TOL, f"{err:.3e}"
    if norm:
        assert torch.equal(s, (x.float() + res.float()).to(BF16) if residual else x)  # the stream, exactly


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("mixer", ["mamba2", "gdn"])
def test_decode_gated_norm_gemv_matches_reference(record, batch, mixer):
    """`gated_rms_norm_linear` at the 1B shapes: Mamba2's gated group norm (x * silu(z), 8 groups of 256, z a
    strided view of the input projection) into its 2048 x 2048 out_proj; GDN's per-head norm then * silu(g)
    (16 heads of 64) into its 2048 x 1024 o_proj; bf16 against float64 on the same values."""
    from zebra_kernels.norm import torch_rms_norm_gated

    k, segment, group, before = {"mamba2": (2048, 2048, 256, False), "gdn": (1024, 64, 64, True)}[mixer]
    gen = torch.Generator(device="cuda").manual_seed(batch)
    x = torch.randn(batch, 1, k, generator=gen, device="cuda").to(BF16)
    z = torch.randn(batch, 1, k + 64, generator=gen, device="cuda").to(BF16)[..., 32 : 32 + k]
    norm_w = (torch.rand(segment, generator=gen, device="cuda") + 0.5).to(BF16)
    w = torch.randn(2048, k, generator=gen, device="cuda").div(k**0.5).to(BF16)
    with torch.no_grad():
        y = zk.gated_rms_norm_linear(x, z, norm_w, w, eps=1e-5, group_size=group, norm_before_gate=before)
        normed = torch_rms_norm_gated(
            x.double().unflatten(-1, (-1, segment)), z.double().unflatten(-1, (-1, segment)), norm_w.double(),
            1e-5, "swish", before, group,
        ).flatten(-2)  # fmt: skip
        ry = normed @ w.double().T
    assert y.dtype == BF16 and y.shape == (batch, 1, 2048)
    err = relative_error(y, ry) if torch.isfinite(y).all() else math.inf
    record(f"gemv-gated-{mixer}-B{batch}", "out", err)
    assert err < TOL, f"{err:.3e}"
