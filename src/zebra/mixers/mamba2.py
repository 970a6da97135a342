"""Mamba2, the `M` sublayer: Megatron `MambaMixer` parameterisation (`zebra.models.layers.mamba2`)."""

from __future__ import annotations

from typing import Any

from zebra.mixers.spec import (
    HEAD_DIM,
    HEADS,
    MEGATRON_LAYER,
    RECURRENT_PRE_NORM,
    ZEBRA_LAYER,
    Blocker,
    ConfigField,
    GgufAdapter,
    MegatronAdapter,
    MixerSpec,
    NativeAdapter,
    NativeTensor,
    Shapes,
    UpcycleAdapter,
    column,
    conv_check,
    neg_exp,
    register_mixer,
    weights,
)

# Megatron's MambaMixer builds its gated norm with eps=1e-5 whatever the model's norm epsilon.
MAMBA_NORM_EPS = 1e-5
GGUF_EXPAND = 2  # llama.cpp's granitehybrid loader asserts an inner width d_inner == 2 * n_embd
# its parameters: Zebra and Bamba keep Megatron's MambaMixer names and layouts
_PARAMS = (
    "in_proj.weight",
    "conv1d.weight",
    "conv1d.bias",
    "A_log",
    "D",
    "dt_bias",
    "norm.weight",
    "out_proj.weight",
)


def mamba_num_heads(cfg: Any) -> int:
    """Mamba2 heads Hm = expand * hidden_size / head_dim."""
    return cfg.mamba_expand * cfg.hidden_size // cfg.mamba_head_dim


def _params(cfg: Any) -> int:
    d, d_inner, heads = cfg.hidden_size, cfg.mamba_expand * cfg.hidden_size, mamba_num_heads(cfg)
    gn = cfg.mamba_num_groups * cfg.mamba_state_dim
    n = d * (2 * d_inner + 2 * gn + heads)  # in_proj -> [z | x | B | C | dt]
    n += (d_inner + 2 * gn) * (cfg.mamba_conv_size + 1)  # conv1d weight + bias over xBC
    n += 3 * heads  # A_log, D, dt_bias
    n += d_inner  # gated RMSNorm
    return n + d_inner * d  # out_proj


def _state(cfg: Any, batch_size: int, max_length: int) -> Shapes:
    conv_channels = cfg.mamba_expand * cfg.hidden_size + 2 * cfg.mamba_num_groups * cfg.mamba_state_dim
    return {
        "recurrent": (batch_size, mamba_num_heads(cfg), cfg.mamba_state_dim, cfg.mamba_head_dim),
        "conv": (batch_size, conv_channels, cfg.mamba_conv_size),
    }


def _check(cfg: Any) -> list[tuple[str, str]]:
    inner = cfg.mamba_expand * cfg.hidden_size
    if inner % cfg.mamba_head_dim:
        return [("head_dim", f"expand*hidden_size {inner} is not divisible by {cfg.mamba_head_dim}")]
    if (inner // cfg.mamba_head_dim) % cfg.mamba_num_groups:
        return [
            (
                "num_groups",
                f"{inner // cfg.mamba_head_dim} heads do not split into {cfg.mamba_num_groups} groups "
                "(expected a divisor of the head count)",
            )
        ]
    return conv_check(cfg.mamba_conv_size)


def _megatron_fields(arg, first) -> dict[str, Any]:
    """Sizes from the saved args; the inner width and conv width from the first Mamba2 layer's tensors."""
    return {
        "state_dim": int(arg("mamba_state_dim")),
        "head_dim": int(arg("mamba_head_dim")),
        "num_groups": int(arg("mamba_num_groups")),
        "expand": first("mixer.out_proj.weight")[1] // int(arg("hidden_size")),
        "conv_size": first("mixer.conv1d.weight")[-1],
    }


def _upcycle_fields(shape: Any, problems: list[str]) -> dict[str, Any]:
    """Megatron's layout with one B/C group per query head: ngroups = heads = H, head_dim = state = Dh,
    expand = H * Dh / D."""
    h, dh = shape.num_heads, shape.head_dim
    inner = h * dh
    if inner % shape.hidden_size:
        problems.append(
            f"Mamba2 needs the attention width {h} x {dh} = {inner} to be a multiple of the width "
            f"{shape.hidden_size} (inner width = expand * width); use --mixer gdn or kda"
        )
    return dict(
        state_dim=dh, head_dim=dh, num_groups=h, expand=max(1, inner // shape.hidden_size), conv_size=4
    )


def _native_blockers(cfg: Any) -> list[Blocker]:
    if cfg.rms_norm_eps != MAMBA_NORM_EPS:
        why = "one epsilon serves every norm there, and Zebra's Mamba2 gated norm uses 1e-5"
        return [Blocker("model.norm_eps", cfg.rms_norm_eps, MAMBA_NORM_EPS, why)]
    return []


def _native_config(cfg: Any) -> dict[str, Any]:
    """Bamba's Mamba2 sizes."""
    return {
        "mamba_n_heads": mamba_num_heads(cfg),
        "mamba_d_head": cfg.mamba_head_dim,
        "mamba_n_groups": cfg.mamba_num_groups,
        "mamba_d_state": cfg.mamba_state_dim,
        "mamba_d_conv": cfg.mamba_conv_size,
        "mamba_expand": cfg.mamba_expand,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
    }


def _gguf_blockers(cfg: Any) -> list[Blocker]:
    out = []
    if cfg.mamba_expand != GGUF_EXPAND:
        why = "its loader asserts an inner width of twice the model width"
        out.append(Blocker("model.mamba.expand", cfg.mamba_expand, GGUF_EXPAND, why))
    return out + _native_blockers(cfg)  # the norm epsilon, as the native export


def _gguf_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    """llama.cpp's granitehybrid Mamba2 block: Megatron's layouts, the decay rates as `A = -exp(A_log)`."""
    G = cfg.mamba_num_groups
    return [
        NativeTensor(b + "ssm_in.weight", weights(z, "in_proj")),  # rows [z | x | B | C | dt] as llama.cpp
        NativeTensor(b + "ssm_conv1d.weight", weights(z, "conv1d"), lambda p: p[0].squeeze(1)),  # [C, W]
        NativeTensor(b + "ssm_conv1d.bias", (z + "conv1d.bias",)),
        NativeTensor(b + "ssm_dt.bias", (z + "dt_bias",)),
        NativeTensor(b + "ssm_a", (z + "A_log",), column(neg_exp)),
        NativeTensor(b + "ssm_d", (z + "D",), column(lambda p: p[0])),
        NativeTensor(b + "ssm_norm.weight", weights(z, "norm"), lambda p: p[0].reshape(G, -1)),  # per group
        NativeTensor(b + "ssm_out.weight", weights(z, "out_proj")),
    ]


MAMBA2 = register_mixer(
    MixerSpec(
        char="M",
        name="mamba2",
        label="Mamba2",
        title="Mamba2",
        layer="zebra.models.layers.mamba2.Mamba2",
        params=_params,
        layer_args=("hidden_size", "layer_idx", "backend"),
        state="recurrent",
        state_shapes=_state,
        config_prefix="mamba",
        fields=(
            ConfigField("state_dim", 64, "SSM state size N", 1, HEAD_DIM),
            ConfigField("head_dim", 64, "channels per head P", 1, HEAD_DIM),
            ConfigField("num_groups", 8, "B/C groups", 1, HEADS),
            ConfigField("expand", 1, "inner width = expand * hidden_size", 1, 4),
            ConfigField("conv_size", 4, "short causal convolution width", 2, 8),
        ),
        section="mamba",
        section_doc="Mamba2 dimensions",
        check=_check,
        summary=lambda c: (
            f"state {c.mamba_state_dim}, head {c.mamba_head_dim}, groups {c.mamba_num_groups}, "
            f"expand {c.mamba_expand}"
        ),
        megatron=MegatronAdapter(
            detect=lambda names: "mixer.D" in names,
            fields=_megatron_fields,
            keys={  # megatron-core's MambaMixer (ssm/mamba_mixer.py): Zebra keeps its fused in_proj / conv1d
                **RECURRENT_PRE_NORM,
                **{MEGATRON_LAYER + f"mixer.{p}": ZEBRA_LAYER + f"mixer.{p}" for p in _PARAMS},
            },
            parts=(("z", "x", "B", "C", "dt"), ("x", "B", "C")),  # in_proj; conv1d weight and bias
        ),
        upcycle=UpcycleAdapter(
            fields=_upcycle_fields,
            copy="zebra.upcycle.recurrent:mamba2_from_attention",
            gates="zebra.upcycle.gates:mamba2_gates",
            aliases=("mamba",),
        ),
        native=NativeAdapter(
            tensors=lambda cfg, z, n, to: [NativeTensor(n + p, (z + p,)) for p in _PARAMS],
            blockers=_native_blockers,
            config=_native_config,
            servable="tiny-mamba's pure Mamba2 form (--to bamba, or --to granite-hybrid for vLLM and SGLang)",
        ),
        gguf=GgufAdapter(tensors=_gguf_tensors, blockers=_gguf_blockers),
    )
)
