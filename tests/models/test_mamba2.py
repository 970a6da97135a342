"""Mamba2 mixer against Megatron's MambaMixer math.

Megatron's `MambaMixer` cannot be built here (it needs mamba-ssm and CUDA), so the reference is its decode step
(`megatron/core/ssm/mamba_mixer.py`, `_ssm_decode` without the fused kernels: conv-state roll, SiLU, dt softplus,
per-group B/C repeated over heads, `state * exp(dt A) + dt B x`, `y = C.state + D x`) written out test-locally,
and the gated norm is `rms_norm_ref` (mamba-ssm's reference, as vendored by FLA) with `norm_before_gate=False` and
`group_size = d_inner / ngroups`, the configuration MambaMixer builds (in float64, with a float32-exact weight
because `rms_norm_ref` casts the weight to float32). Our layer runs its chunked form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zebra.models.layers.mamba2 import MAMBA_NORM_EPS, Mamba2


def megatron_decode_reference(layer: Mamba2, hidden_states: torch.Tensor) -> torch.Tensor:
    from fla.modules.norm.layernorm_gated import rms_norm_ref

    Bt, T, _ = hidden_states.shape
    d_inner, G, N, P = layer.d_inner, layer.num_groups, layer.state_dim, layer.head_dim
    H = layer.num_heads
    weight = layer.conv1d.weight[:, 0]  # [C, W]
    conv_state = hidden_states.new_zeros(Bt, weight.shape[0], weight.shape[1])  # (B D W)
    ssm_state = hidden_states.new_zeros(Bt, H, P, N)
    A = -torch.exp(layer.A_log)
    outputs = []
    for t in range(T):
        z, xBC, dt = layer.in_proj(hidden_states[:, t]).split([d_inner, d_inner + 2 * G * N, H], dim=-1)
        conv_state = torch.roll(conv_state, shifts=-1, dims=-1)
        conv_state[:, :, -1] = xBC
        xBC = F.silu((conv_state * weight).sum(-1) + layer.conv1d.bias)
        x, B, C = xBC.split([d_inner, G * N, G * N], dim=-1)
        B = B.view(Bt, G, N).repeat_interleave(d_inner // G, dim=1)  # [B, (g h), N] per channel
        C = C.view(Bt, G, N).repeat_interleave(d_inner // G, dim=1)
        dt = F.softplus(dt + layer.dt_bias).repeat_interleave(P, dim=1)  # [B, d_inner]
        dA = torch.exp(dt * A.repeat_interleave(P))[:, :, None].expand(Bt, d_inner, N)  # [B, d_inner, N]
        dBx = dt[:, :, None] * B * x[:, :, None]
        ssm_state = ssm_state * dA.view(Bt, H, P, N) + dBx.view(Bt, H, P, N)
        y = (ssm_state.view(Bt, d_inner, N) * C).sum(-1) + layer.D.repeat_interleave(P) * x
        y = rms_norm_ref(
            y,
            layer.norm.weight,
            None,
            z=z,
            eps=MAMBA_NORM_EPS,
            group_size=d_inner // G,
            norm_before_gate=False,
            upcast=False,
        )
        outputs.append(layer.out_proj(y))
    return torch.stack(outputs, dim=1)


def test_mamba2_equals_megatron_mixer_math():
    torch.manual_seed(0)
    layer = Mamba2(32, state_dim=8, head_dim=8, num_groups=2, expand=2, conv_size=4, backend="torch").double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name not in ("A_log", "dt_bias"):
                p.normal_(0.0, 0.3) if "norm" not in name else p.copy_(1 + 0.2 * torch.randn_like(p))
        layer.norm.weight.copy_(layer.norm.weight.float())  # rms_norm_ref casts the weight to float32
    x = torch.randn(2, 23, 32, dtype=torch.float64)
    expected = megatron_decode_reference(layer, x)
    with torch.enable_grad():
        got = layer(x)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
