"""Kimi Delta Attention, the `K` sublayer: FLA `KimiDeltaAttention` parameterisation (`zebra.models.layers.kda`)."""

from __future__ import annotations

from typing import Any

from zebra.errors import ZebraError
from zebra.mixers.delta_rule import fla_dims, megatron_dims, upcycle_from_attention
from zebra.mixers.spec import (
    HEAD_DIM,
    HEADS,
    ConfigField,
    FLAAdapter,
    MegatronAdapter,
    MixerSpec,
    Shapes,
    conv_check,
    fla_refuse,
    register_mixer,
)


def _params(cfg: Any) -> int:
    d, h, dk, dv = cfg.hidden_size, cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_head_v_dim
    key, val = h * dk, h * dv
    n = d * (2 * key + val)  # q, k, v
    n += d * dv + dv * key  # f_proj: D -> dv -> H*K (decay)
    n += d * h  # b_proj (beta)
    n += d * dv + dv * val + val * bool(cfg.kda_gate_bias)  # g_proj: D -> dv -> H*V (+ bias): output gate
    n += val * d  # o_proj
    n += (2 * key + val) * cfg.kda_conv_size
    return n + h + key + dv  # A_log [H], dt_bias [H*K], o_norm [V]


def _state(cfg: Any, batch_size: int, max_length: int) -> Shapes:
    h, dk, dv = cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_head_v_dim
    return {
        "recurrent": (batch_size, h, dk, dv),
        "conv": (batch_size, h * (2 * dk + dv), cfg.kda_conv_size),
    }


def _from_fla(cfg: dict[str, Any]) -> dict[str, Any]:
    fla_refuse(cfg, "num_v_heads", (None, cfg["num_heads"]), "Zebra's KDA has one head count: convert a KDA "
               "model without grouped value heads")  # fmt: skip
    for flag in ("allow_neg_eigval", "safe_gate"):
        fla_refuse(
            cfg, flag, (None, False), f"Zebra's KDA has no {flag}: keep using this model with FLA itself"
        )
    return fla_dims(cfg)


def _to_fla(z: Any) -> dict[str, Any]:
    if not z.kda_gate_bias:
        raise ZebraError(
            "model.kda.gate_bias=false: FLA's KimiDeltaAttention has an output-gate bias",
            fix="export this model with --to kimi-linear (Kimi-Linear's form has none)",
        )
    return {
        "head_dim": z.kda_head_dim,
        "num_heads": z.kda_num_heads,
        "num_v_heads": None,
        "expand_v": z.kda_head_v_dim / z.kda_head_dim,
        "conv_size": z.kda_conv_size,
        "allow_neg_eigval": False,
        "safe_gate": False,
        "lower_bound": None,
    }


def _megatron_fields(arg, first) -> dict[str, Any]:
    dims = megatron_dims(arg)
    heads, k_heads = dims.pop("num_v_heads"), dims["num_heads"]
    if heads != k_heads:
        raise ValueError(
            f"KDA with {k_heads} key heads and {heads} value heads; Zebra's KDA has one head count"
        )
    return dims


KDA = register_mixer(
    MixerSpec(
        char="K",
        name="kda",
        label="KDA",
        title="Kimi Delta Attention",
        layer="zebra.models.layers.kda.KimiDeltaAttention",
        params=_params,
        layer_args=("hidden_size", "norm_eps", "layer_idx", "backend"),
        state="recurrent",
        state_shapes=_state,
        config_prefix="kda",
        fields=(
            ConfigField("num_heads", 16, "heads", 1, HEADS),
            ConfigField("head_dim", 32, "query/key channels per head", 1, HEAD_DIM),
            ConfigField("head_v_dim", 64, "value channels per head", 1, HEAD_DIM),
            ConfigField("conv_size", 4, "short causal convolution width", 2, 8),
            ConfigField("gate_bias", True, "a bias on the output gate (false: none, Kimi-Linear's form)"),
        ),
        section="kda",
        section_doc="Kimi Delta Attention dimensions",
        check=lambda c: conv_check(c.kda_conv_size),
        summary=lambda c: (
            f"{c.kda_num_heads} heads, key {c.kda_head_dim}, value {c.kda_head_v_dim}, conv {c.kda_conv_size}"
            + ("" if c.kda_gate_bias else ", output gate without bias")
        ),
        fla=FLAAdapter(
            model_type="kda",
            architecture="KDAForCausalLM",
            config_class="KDAConfig",
            layer_class="KimiDeltaAttention",
            defaults={"head_dim": 128, "num_heads": 16, "expand_v": 1.0, "num_hidden_layers": 24},
            to_zebra=_from_fla,
            from_zebra=_to_fla,
        ),
        megatron=MegatronAdapter(
            detect=lambda names: "mixer.f_b_proj.weight" in names,
            fields=_megatron_fields,
            keys="zebra.convert.megatron_keys:KDA",
            dims=lambda c: {
                "kda_key": c.kda_num_heads * c.kda_head_dim,
                "kda_value": c.kda_num_heads * c.kda_head_v_dim,
                "kda_head_v": c.kda_head_v_dim,
                "kda_heads": c.kda_num_heads,
            },
        ),
        upcycle=upcycle_from_attention(
            "KDA from attention has no published recipe: the Q/K/V/O copy of GDN is used", value_heads=False
        ),
    )
)
