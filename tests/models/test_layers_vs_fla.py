"""GDN, KDA and GLA mixers against FLA's own layer classes (`fla.layers.GatedDeltaNet`,
`fla.layers.KimiDeltaAttention`, `fla.layers.GatedLinearAttention`).

What is compared, honestly: FLA's layer code runs unchanged (its projections, rearranges, gate/beta flags,
padding by unpadding to `cu_seqlens`, output norm wiring), but its Triton kernels cannot run on CPU, so they are
replaced for the test by FLA's torch references where FLA has them (`naive_recurrent_gated_delta_rule`,
`naive_recurrent_kda`, `naive_recurrent_gla`, `naive_gdn_gate`, `naive_kda_gate`, `rms_norm_ref`) glued by a small test-local shim that
applies the in-kernel flags exactly as FLA's docstrings define them (q/k L2 norm x / sqrt(sum x^2 + 1e-6),
sigmoid beta, x2 with allow_neg_eigval, the gate from A_log/dt_bias) plus a plain depthwise causal conv for
`ShortConvolution`. FLA's state dicts load into our mixers with strict=True (same names and shapes).
FLA's naive references compute in float32, so the comparison is in float32.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from zebra.models.layers.gated_deltanet import GatedDeltaNet
from zebra.models.layers.gla import GatedLinearAttention
from zebra.models.layers.kda import KimiDeltaAttention

D, T, B = 64, 20, 3


def l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def segments(cu_seqlens, T_total):
    bounds = [0, T_total] if cu_seqlens is None else cu_seqlens.tolist()
    return list(itertools.pairwise(bounds))


def conv_ref(x, weight, bias, activation, cu_seqlens=None):
    """Depthwise causal conv over `[B, T, C]`, restarting at each packed-sequence boundary."""
    W = weight.shape[-1]
    out = []
    for s, e in segments(cu_seqlens, x.shape[1]):
        xs = F.pad(x[:, s:e].transpose(1, 2), (W - 1, 0))
        out.append(F.conv1d(xs, weight.view(-1, 1, W), bias, groups=weight.shape[0]).transpose(1, 2))
    y = torch.cat(out, dim=1)
    return F.silu(y) if activation in ("silu", "swish") else y


def per_sequence(naive, q, k, v, g, beta, cu_seqlens):
    outs = [
        naive(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e])
        for s, e in segments(cu_seqlens, q.shape[1])
    ]
    return torch.cat(outs, dim=1)


def gated_delta_rule_ref(
    q, k, v, g, beta, *, initial_state=None, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False, cu_seqlens=None, use_gate_in_kernel=False, A_log=None, dt_bias=None, **unused,
):  # fmt: skip
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    assert initial_state is None
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if use_beta_sigmoid_in_kernel:
        beta = beta.float().sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    if use_gate_in_kernel:
        g = naive_gdn_gate(g, A_log, dt_bias)
    group = (
        v.shape[2] // q.shape[2]
    )  # GVA: value head j reads q/k head j // group (FLA: i_h = i_hv // (HV // H))
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)

    def naive(q, k, v, g, beta):
        return naive_recurrent_gated_delta_rule(q, k, v, beta, g)[0]

    return per_sequence(naive, q, k, v, g, beta, cu_seqlens), None


def kda_ref(
    q, k, v, g, beta, *, A_log=None, dt_bias=None, initial_state=None, use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
    cu_seqlens=None, **unused,
):  # fmt: skip
    from fla.ops.kda.gate import naive_kda_gate
    from fla.ops.kda.naive import naive_recurrent_kda

    assert initial_state is None and lower_bound is None
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if use_beta_sigmoid_in_kernel:
        beta = beta.float().sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    if use_gate_in_kernel:
        g = naive_kda_gate(g, A_log, dt_bias)

    def naive(q, k, v, g, beta):
        return naive_recurrent_kda(q, k, v, g, beta)[0]

    return per_sequence(naive, q, k, v, g, beta, cu_seqlens), None


def gla_ref(q, k, v, g=None, gk=None, *, initial_state=None, cu_seqlens=None, state_v_first=False, **unused):
    """FLA's `chunk_gla(q, k, v, g)` / `fused_recurrent_gla(q, k, v, gk=...)` by its naive form."""
    from fla.ops.gla.naive import naive_recurrent_gla

    assert initial_state is None
    g = g if g is not None else gk

    def naive(q, k, v, g, _beta):
        return naive_recurrent_gla(q, k, v, g)[0]

    return per_sequence(naive, q, k, v, g, g, cu_seqlens), None


@pytest.fixture
def fla_on_cpu(monkeypatch):
    """Run FLA's layer classes on CPU: Triton ops -> torch references (see the module docstring)."""
    import fla.layers.gated_deltanet as fla_gdn
    import fla.layers.gla as fla_gla
    import fla.layers.kda as fla_kda
    from fla.modules import FusedRMSNormGated, ShortConvolution
    from fla.modules.norm.layernorm_gated import rms_norm_ref

    def short_conv(
        self, x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None, **kw
    ):
        assert residual is None and mask is None and cache is None
        return conv_ref(x, self.weight[:, 0], self.bias, self.activation, cu_seqlens), None

    def fused_conv(x, weight, bias=None, activation=None, **kw):
        return conv_ref(x, weight, bias, activation), None

    def gated_norm(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        if self.activation in ("swish", "silu"):
            return rms_norm_ref(x, self.weight, None, z=g, eps=self.eps, norm_before_gate=True)
        return rms_norm_ref(x, self.weight, None, eps=self.eps) * torch.sigmoid(g)

    monkeypatch.setattr(ShortConvolution, "forward", short_conv)
    monkeypatch.setattr(FusedRMSNormGated, "forward", gated_norm)
    monkeypatch.setattr(fla_gdn, "causal_conv1d", fused_conv)
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        monkeypatch.setattr(fla_gdn, name, gated_delta_rule_ref)
    for name in ("chunk_kda", "fused_recurrent_kda"):
        monkeypatch.setattr(fla_kda, name, kda_ref)
    for name in ("chunk_gla", "fused_recurrent_gla"):
        monkeypatch.setattr(fla_gla, name, gla_ref)


def randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name == "A_log":
                p.copy_(torch.empty(p.shape).uniform_(0.5, 8.0, generator=gen).log())
            elif name == "dt_bias":
                p.copy_(torch.randn(p.shape, generator=gen) - 3.0)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def compare(fla_layer, ours, train: bool):
    randomize(fla_layer, seed=0)
    ours.load_state_dict(fla_layer.state_dict(), strict=True)  # same names and shapes
    fla_layer.train(train)
    ours.train(train)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, D, generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :7], mask[2, :13] = 0, 0  # left padding
    with torch.set_grad_enabled(train):
        expected = fla_layer(x)[0]
        got = ours(x)
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)
        expected = fla_layer(x, attention_mask=mask)[0]
        got = ours(x, attention_mask=mask)
    valid = mask.bool()
    torch.testing.assert_close(got[valid], expected[valid], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("allow_neg_eigval", [False, True])
@pytest.mark.parametrize("train", [True, False])
def test_gated_deltanet_equals_fla_layer(fla_on_cpu, allow_neg_eigval, train):
    from fla.layers import GatedDeltaNet as FLAGatedDeltaNet

    fla_layer = FLAGatedDeltaNet(
        hidden_size=D, expand_v=1, head_dim=16, num_heads=2, num_v_heads=4, conv_size=4, norm_eps=1e-6,
        allow_neg_eigval=allow_neg_eigval,
    )  # fmt: skip
    ours = GatedDeltaNet(D, 2, 16, 4, 16, conv_size=4, allow_neg_eigval=allow_neg_eigval, backend="torch")
    compare(fla_layer, ours, train)


@pytest.mark.parametrize("train", [True, False])
def test_kimi_delta_attention_equals_fla_layer(fla_on_cpu, train):
    from fla.layers import KimiDeltaAttention as FLAKimiDeltaAttention

    fla_layer = FLAKimiDeltaAttention(
        hidden_size=D, expand_v=1, head_dim=16, num_heads=4, conv_size=4, norm_eps=1e-6
    )
    ours = KimiDeltaAttention(D, 4, 16, 16, conv_size=4, backend="torch")
    compare(fla_layer, ours, train)


@pytest.mark.parametrize("train", [True, False])
def test_gated_linear_attention_equals_fla_layer(fla_on_cpu, train):
    from fla.layers import GatedLinearAttention as FLAGatedLinearAttention

    fla_layer = FLAGatedLinearAttention(
        hidden_size=D,
        expand_k=0.5,
        expand_v=1.0,
        num_heads=2,
        use_short_conv=True,
        conv_size=4,
        norm_eps=1e-6,
    )
    ours = GatedLinearAttention(D, 2, 16, 32, conv_size=4, backend="torch")
    compare(fla_layer, ours, train)
