"""Gated Linear Attention, the `L` sublayer: FLA `GatedLinearAttention` parameterisation
(`zebra.models.layers.gla`, kernels `zebra_kernels.gla`)."""

from __future__ import annotations

from typing import Any

from zebra.mixers.spec import (
    HEAD_DIM,
    HEADS,
    ConfigField,
    FLAAdapter,
    MixerSpec,
    Shapes,
    UpcycleAdapter,
    conv_check,
    fla_refuse,
    register_mixer,
)

GATE_RANK = 16  # FLA's gate_low_rank_dim (its GLAConfig has no key for it)
# The FLA GLAConfig fields Zebra's GLA fixes (`_from_fla` refuses other values; `to_fla` writes these)
_FLA_FIXED = {
                "num_kv_heads": None,
                "feature_map": None,
                "clamp_min": None,
                "use_output_gate": True,
                "use_gk": True,
                "use_gv": False,
                "elementwise_affine": True,
            }  # fmt: skip
# FLA 0.6.0's GLAConfig defaults of the fields read here (a config.json without them means these)
_FLA_DEFAULTS = {
                "expand_k": 0.5,
                "expand_v": 1.0,
                "num_heads": 4,
                "num_hidden_layers": 24,
                "use_short_conv": False,
                **_FLA_FIXED,
                "fuse_norm": True,
            }  # fmt: skip


def _params(cfg: Any) -> int:
    d, h, dk, dv = cfg.hidden_size, cfg.gla_num_heads, cfg.gla_head_dim, cfg.gla_head_v_dim
    key, val = h * dk, h * dv
    n = d * (2 * key + 2 * val)  # q, k, v, g (output gate)
    n += d * GATE_RANK + GATE_RANK * key + key  # gk_proj: D -> R -> H*K with bias (decay)
    n += val * d  # o_proj
    n += (2 * key + val) * cfg.gla_conv_size  # depthwise convs, no bias
    return n + dv  # the gated output norm


def _state(cfg: Any, batch_size: int, max_length: int) -> Shapes:
    h, dk, dv = cfg.gla_num_heads, cfg.gla_head_dim, cfg.gla_head_v_dim
    return {"recurrent": (batch_size, h, dk, dv), "conv": (batch_size, h * (2 * dk + dv), cfg.gla_conv_size)}


def _check(cfg: Any) -> list[tuple[str, str]]:
    return conv_check(cfg.gla_conv_size)


def _from_fla(cfg: dict[str, Any]) -> dict[str, Any]:
    keep = "keep using this model with FLA itself"
    fla_refuse(cfg, "num_kv_heads", (None, cfg["num_heads"]), f"Zebra's GLA has one head count: {keep}")
    for key, allowed in (("feature_map", None), ("clamp_min", None), ("use_gv", False)):
        fla_refuse(cfg, key, (allowed,), f"Zebra's GLA has no {key}: {keep}")
    for key in ("use_output_gate", "use_gk", "elementwise_affine", "fuse_norm"):
        fla_refuse(cfg, key, (True,), f"Zebra's GLA always has {key}=true: {keep}")
    heads, width = cfg["num_heads"], cfg["hidden_size"]
    key_dim, value_dim = width * cfg["expand_k"], width * cfg["expand_v"]
    for name, dim in (("expand_k", key_dim), ("expand_v", value_dim)):
        if dim != round(dim) or round(dim) % heads:
            fla_refuse(cfg, name, (), f"hidden_size * {name} must be a multiple of num_heads {heads}")
    return {
        "num_heads": heads,
        "head_dim": round(key_dim) // heads,
        "head_v_dim": round(value_dim) // heads,
        "conv_size": cfg["conv_size"],
    }


GLA = register_mixer(
    MixerSpec(
        char="L",
        name="gla",
        label="GLA",
        title="Gated Linear Attention",
        layer="zebra.models.layers.gla.GatedLinearAttention",
        params=_params,
        layer_args=("hidden_size", "norm_eps", "layer_idx", "backend"),
        state="recurrent",
        state_shapes=_state,
        config_prefix="gla",
        fields=(
            ConfigField("num_heads", 16, "heads", 1, HEADS),
            ConfigField("head_dim", 64, "query/key channels per head", 1, HEAD_DIM),
            ConfigField("head_v_dim", 128, "value channels per head", 1, HEAD_DIM),
            ConfigField("conv_size", 4, "short causal convolution width", 2, 8),
        ),
        section="gla",
        section_doc="Gated Linear Attention dimensions",
        check=_check,
        summary=lambda c: (
            f"{c.gla_num_heads} heads, key {c.gla_head_dim}, value {c.gla_head_v_dim}, conv {c.gla_conv_size}"
        ),
        fla=FLAAdapter(
            model_type="gla",
            architecture="GLAForCausalLM",
            config_class="GLAConfig",
            layer_class="GatedLinearAttention",
            defaults=_FLA_DEFAULTS,
            to_zebra=_from_fla,
            from_zebra=lambda z: {
                "num_heads": z.gla_num_heads,
                "expand_k": z.gla_num_heads * z.gla_head_dim / z.hidden_size,
                "expand_v": z.gla_num_heads * z.gla_head_v_dim / z.hidden_size,
                "conv_size": z.gla_conv_size,
                **_FLA_FIXED,
            },
        ),
        upcycle=UpcycleAdapter(
            fields=lambda s, problems: dict(
                num_heads=s.num_heads, head_dim=s.head_dim, head_v_dim=s.head_dim, conv_size=4
            ),
            copy="zebra.upcycle.recurrent:qkvo_from_attention",
            note="GLA from attention: the Q/K/V/O copy (GLA is linear attention with a decay); no published recipe",
        ),
    )
)
