"""Kimi Delta Attention, the `K` sublayer: FLA `KimiDeltaAttention` parameterisation (`zebra.models.layers.kda`)."""

from __future__ import annotations

from typing import Any

from zebra.core.errors import ZebraError
from zebra.mixers.delta_rule import L2NORM_EPS, fla_dims, fla_sizes, megatron_dims, upcycle_from_attention
from zebra.mixers.spec import (
    HEAD_DIM,
    HEADS,
    MEGATRON_LAYER,
    RECURRENT_PRE_NORM,
    ZEBRA_LAYER,
    Blocker,
    ConfigField,
    FLAAdapter,
    GgufAdapter,
    MegatronAdapter,
    MixerSpec,
    NativeAdapter,
    NativeTensor,
    Reshape,
    Shapes,
    Split,
    column,
    conv_check,
    eps_blocker,
    fla_refuse,
    neg_exp,
    register_mixer,
    weights,
)

_L, _Z = MEGATRON_LAYER + "mixer.", ZEBRA_LAYER + "mixer."
# Primus' KimiDeltaAttention (primus/backends/megatron/core/models/hybrid/kimi_delta_attention.py): in_proj rows
# [q | k | v | f_a | g_a | beta], conv1d [q | k | v], as its forward splits them.
_MEGATRON_KEYS = {
    **RECURRENT_PRE_NORM,
    _L + "in_proj.weight": Split(
        0,
        (_Z + "q_proj.weight", "kda_key"),
        (_Z + "k_proj.weight", "kda_key"),
        (_Z + "v_proj.weight", "kda_value"),
        (_Z + "f_proj.0.weight", "kda_head_v"),
        (_Z + "g_proj.0.weight", "kda_head_v"),
        (_Z + "b_proj.weight", "kda_heads"),
    ),
    _L + "conv1d.weight": Split(
        0,
        (_Z + "q_conv1d.weight", "kda_key"),
        (_Z + "k_conv1d.weight", "kda_key"),
        (_Z + "v_conv1d.weight", "kda_value"),
    ),
    _L + "f_b_proj.weight": _Z + "f_proj.1.weight",
    _L + "g_b_proj.weight": _Z + "g_proj.1.weight",
    _L + "g_b_proj.bias": _Z + "g_proj.1.bias",
    _L + "A_log": Reshape(_Z + "A_log", ("kda_heads",)),  # Primus stores [1, 1, H, 1]
    _L + "dt_bias": _Z + "dt_bias",
    _L + "out_norm.weight": _Z + "o_norm.weight",
    _L + "out_proj.weight": _Z + "o_proj.weight",
    _L + "gate_norm.weight": None,  # built by the TE spec but never called in forward
}


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
    dims = fla_dims(cfg, value_heads=False)
    for flag in ("allow_neg_eigval", "safe_gate"):
        fla_refuse(
            cfg, flag, (None, False), f"Zebra's KDA has no {flag}: keep using this model with FLA itself"
        )
    return dims


def _to_fla(z: Any) -> dict[str, Any]:
    if not z.kda_gate_bias:
        raise ZebraError(
            "model.kda.gate_bias=false: FLA's KimiDeltaAttention has an output-gate bias",
            fix="export this model with --to kimi-linear (Kimi-Linear's form has none)",
        )
    return {
        **fla_sizes(z, "kda", value_heads=False),
        "allow_neg_eigval": False,
        "safe_gate": False,
        "lower_bound": None,
    }


def _native_blockers(cfg: Any) -> list[Blocker]:
    out = []
    if cfg.kda_gate_bias:
        out.append(Blocker("model.kda.gate_bias", True, False, "its output gate g_b_proj has no bias"))
    if cfg.kda_head_dim != cfg.kda_head_v_dim:
        out.append(
            Blocker(
                "model.kda.head_dim",
                cfg.kda_head_dim,
                cfg.kda_head_v_dim,
                f"one head_dim serves queries, keys and values (head_v_dim is {cfg.kda_head_v_dim})",
            )
        )
    return out


def _native_tensors(cfg: Any, z: str, n: str, to: str) -> list[NativeTensor]:
    """Kimi-Linear's KimiDeltaAttention, in the names Moonshot's checkpoints store (`native._kimi_stored`: what
    vLLM and SGLang read; transformers renames them on load)."""
    H = cfg.kda_num_heads
    return [
        *(NativeTensor(n + f"{p}.weight", (z + f"{p}.weight",)) for p in ("q_proj", "k_proj", "v_proj", "b_proj")),
        *(NativeTensor(n + f"{x}_conv1d.weight", weights(z, f"{x}_conv1d")) for x in "qkv"),  # [H*K, 1, W]
        NativeTensor(n + "f_a_proj.weight", (z + "f_proj.0.weight",)),
        NativeTensor(n + "f_b_proj.weight", (z + "f_proj.1.weight",)),
        NativeTensor(n + "dt_bias", (z + "dt_bias",)),
        NativeTensor(n + "A_log", (z + "A_log",), lambda p: p[0].view(1, 1, H, 1)),
        NativeTensor(n + "g_a_proj.weight", (z + "g_proj.0.weight",)),
        NativeTensor(n + "g_b_proj.weight", (z + "g_proj.1.weight",)),
        NativeTensor(n + "o_norm.weight", (z + "o_norm.weight",)),
        NativeTensor(n + "o_proj.weight", (z + "o_proj.weight",)),
    ]  # fmt: skip


def _native_config(cfg: Any) -> dict[str, Any]:
    """Kimi-Linear's KDA sizes, in transformers' keys and in Moonshot's `linear_attn_config` (vLLM, SGLang)."""
    return {
        "linear_head_dim": cfg.kda_head_dim,
        "linear_num_heads": cfg.kda_num_heads,
        "linear_conv_kernel_dim": cfg.kda_conv_size,
        "linear_attn_config": {
            "head_dim": cfg.kda_head_dim,
            "num_heads": cfg.kda_num_heads,
            "short_conv_kernel_size": cfg.kda_conv_size,
        },
    }


def _gguf_blockers(cfg: Any) -> list[Blocker]:
    out = []
    if cfg.kda_gate_bias:
        out.append(Blocker("model.kda.gate_bias", True, False, "its output gate g_b has no bias"))
    if cfg.kda_head_dim != cfg.kda_head_v_dim:
        why = f"one kda.head_dim serves queries, keys and values (head_v_dim is {cfg.kda_head_v_dim})"
        out.append(Blocker("model.kda.head_dim", cfg.kda_head_dim, cfg.kda_head_v_dim, why))
    if "*" in cfg.layer_pattern and cfg.kda_num_heads != cfg.num_attention_heads:
        why = "one head count serves its KDA and MLA layers"
        out.append(Blocker("model.kda.num_heads", cfg.kda_num_heads, cfg.num_attention_heads, why))
    return out + eps_blocker(cfg, L2NORM_EPS, "its q/k L2 norm uses the model epsilon, Zebra's uses 1e-6")


def _gguf_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    """llama.cpp's kimi-linear KDA block: Zebra's tensors renamed, the decay rates as `A = -exp(A_log)`."""
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "b_proj": "ssm_beta",
             "f_proj.0": "ssm_f_a", "f_proj.1": "ssm_f_b", "g_proj.0": "ssm_g_a", "g_proj.1": "ssm_g_b",
             "o_norm": "ssm_norm", "o_proj": "attn_output"}  # fmt: skip
    convs = [NativeTensor(f"{b}ssm_conv1d_{x}.weight", weights(z, f"{x}_conv1d")) for x in "qkv"]  # [C, 1, W]
    return [
        *(NativeTensor(f"{b}{g}.weight", weights(z, m)) for m, g in names.items()),
        *convs,
        NativeTensor(b + "ssm_dt.bias", (z + "dt_bias",)),
        NativeTensor(b + "ssm_a", (z + "A_log",), column(neg_exp)),
    ]


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
            fields=lambda arg, first: megatron_dims(arg, value_heads=False),
            keys=_MEGATRON_KEYS,
            parts=(
                ("query", "key", "value", "f_a", "g_a", "beta"),
                ("query", "key", "value"),
            ),  # in_proj, conv1d
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
        native=NativeAdapter(
            tensors=_native_tensors,
            blockers=_native_blockers,
            config=_native_config,
            servable="1b-kda-mla-kimi (KDA + NoPE MLA, --to kimi-linear)",
        ),
        gguf=GgufAdapter(tensors=_gguf_tensors, blockers=_gguf_blockers),
    )
)
