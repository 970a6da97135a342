"""Gated DeltaNet, the `G` sublayer: FLA `GatedDeltaNet` parameterisation (`zebra.models.layers.gated_deltanet`)."""

from __future__ import annotations

from collections.abc import Callable
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
    Shapes,
    Split,
    concat,
    conv_check,
    eps_blocker,
    neg_exp,
    register_mixer,
    weights,
)

_L, _Z = MEGATRON_LAYER + "mixer.", ZEBRA_LAYER + "mixer."
# Primus' GatedDeltaNet (primus/backends/megatron/core/models/hybrid/gated_delta_net.py): in_proj rows
# [q | k | v | gate (z) | beta | alpha], conv1d [q | k | v], as its forward splits them.
_MEGATRON_KEYS = {
    **RECURRENT_PRE_NORM,
    _L + "in_proj.weight": Split(
        0,
        (_Z + "q_proj.weight", "gdn_key"),
        (_Z + "k_proj.weight", "gdn_key"),
        (_Z + "v_proj.weight", "gdn_value"),
        (_Z + "g_proj.weight", "gdn_value"),
        (_Z + "b_proj.weight", "gdn_v_heads"),
        (_Z + "a_proj.weight", "gdn_v_heads"),
    ),
    _L + "conv1d.weight": Split(
        0,
        (_Z + "q_conv1d.weight", "gdn_key"),
        (_Z + "k_conv1d.weight", "gdn_key"),
        (_Z + "v_conv1d.weight", "gdn_value"),
    ),
    _L + "A_log": _Z + "A_log",
    _L + "dt_bias": _Z + "dt_bias",
    _L + "out_norm.weight": _Z + "o_norm.weight",
    _L + "out_proj.weight": _Z + "o_proj.weight",
}


def _params(cfg: Any) -> int:
    d = cfg.hidden_size
    key, val = cfg.gdn_num_heads * cfg.gdn_head_dim, cfg.gdn_num_v_heads * cfg.gdn_head_v_dim
    hv = cfg.gdn_num_v_heads
    n = d * (2 * key + 2 * val + 2 * hv)  # q, k, v, g (gate), a, b projections
    n += val * d  # o_proj
    n += (2 * key + val) * cfg.gdn_conv_size  # depthwise convs, no bias
    return n + 2 * hv + cfg.gdn_head_v_dim  # A_log, dt_bias, o_norm


def _dims(cfg: Any) -> dict[str, int]:
    """Key width, value width, value heads."""
    key, val = cfg.gdn_num_heads * cfg.gdn_head_dim, cfg.gdn_num_v_heads * cfg.gdn_head_v_dim
    return {"gdn_key": key, "gdn_value": val, "gdn_v_heads": cfg.gdn_num_v_heads}


def _state(cfg: Any, batch_size: int, max_length: int) -> Shapes:
    dims = _dims(cfg)
    return {
        "recurrent": (batch_size, cfg.gdn_num_v_heads, cfg.gdn_head_dim, cfg.gdn_head_v_dim),
        "conv": (batch_size, 2 * dims["gdn_key"] + dims["gdn_value"], cfg.gdn_conv_size),
    }


def _check(cfg: Any) -> list[tuple[str, str]]:
    if cfg.gdn_num_v_heads % cfg.gdn_num_heads:
        return [("num_v_heads", f"{cfg.gdn_num_v_heads} is not a multiple of num_heads {cfg.gdn_num_heads}")]
    return conv_check(cfg.gdn_conv_size)


def _from_fla(cfg: dict[str, Any]) -> dict[str, Any]:
    src = cfg["_source"]
    if not cfg.get("use_gate", True):
        raise ZebraError(
            f"{src}: use_gate=false (GDN without output gate) has no Zebra equivalent",
            fix="Zebra's GDN always gates its output: keep using this model with FLA itself",
        )
    if cfg.get("output_gate_activation", "swish") not in ("swish", "silu"):
        raise ZebraError(
            f"{src}: output_gate_activation={cfg['output_gate_activation']!r} has no Zebra equivalent (swish only)",
            fix="convert a GDN model with the default swish output gate",
        )
    return fla_dims(cfg, value_heads=True) | {"allow_neg_eigval": bool(cfg.get("allow_neg_eigval", False))}


def _to_fla(z: Any) -> dict[str, Any]:
    return {
        **fla_sizes(z, "gdn", value_heads=True),
        "use_gate": True,
        "allow_neg_eigval": bool(getattr(z, "gdn_allow_neg_eigval", False)),
        "output_gate_activation": "swish",
        "fuse_linear_cross_entropy": False,
    }


def _native_blockers(cfg: Any) -> list[Blocker]:
    if cfg.gdn_allow_neg_eigval:
        return [Blocker("model.gdn.allow_neg_eigval", True, False, "beta is sigmoid(b) in (0, 1) there")]
    return []


def _qwen3_next_qkvz(cfg: Any) -> Any:
    """`[q | k | v | g]` (Zebra, each by head) -> per key head `[q_h | k_h | v_h.. | z_h..]` (Qwen3-Next)."""
    H, K, V, r = (
        cfg.gdn_num_heads,
        cfg.gdn_head_dim,
        cfg.gdn_head_v_dim,
        cfg.gdn_num_v_heads // cfg.gdn_num_heads,
    )

    def build(parts: list[Any]) -> Any:
        q, k, v, z = parts  # [H*K, D], [H*K, D], [HV*V, D], [HV*V, D]
        D = q.shape[-1]
        grouped = [q.view(H, K, D), k.view(H, K, D), v.view(H, r * V, D), z.view(H, r * V, D)]
        return concat(grouped, dim=1).reshape(-1, D)  # [H * (2K + 2rV), D]

    return build


def _qwen3_next_ba(cfg: Any) -> Any:
    H, r = cfg.gdn_num_heads, cfg.gdn_num_v_heads // cfg.gdn_num_heads

    def build(parts: list[Any]) -> Any:
        b, a = parts  # [HV, D] each
        D = b.shape[-1]
        grouped = [b.view(H, r, D), a.view(H, r, D)]
        return concat(grouped, dim=1).reshape(-1, D)  # [H * 2r, D]

    return build


def _native_tensors(cfg: Any, z: str, n: str, to: str) -> list[NativeTensor]:
    if to == "qwen3-next":  # interleaved per key head
        projections = [
            NativeTensor(n + "in_proj_qkvz.weight", weights(z, "q_proj", "k_proj", "v_proj", "g_proj"), _qwen3_next_qkvz(cfg)),
            NativeTensor(n + "in_proj_ba.weight", weights(z, "b_proj", "a_proj"), _qwen3_next_ba(cfg)),
        ]  # fmt: skip
    else:  # Qwen3.5: separate projections
        projections = [
            NativeTensor(n + "in_proj_qkv.weight", weights(z, "q_proj", "k_proj", "v_proj"), concat),
            NativeTensor(n + "in_proj_z.weight", weights(z, "g_proj")),
            NativeTensor(n + "in_proj_b.weight", weights(z, "b_proj")),
            NativeTensor(n + "in_proj_a.weight", weights(z, "a_proj")),
        ]
    return [
        *projections,
        NativeTensor(n + "conv1d.weight", weights(z, "q_conv1d", "k_conv1d", "v_conv1d"), concat),
        NativeTensor(n + "A_log", (z + "A_log",)),
        NativeTensor(n + "dt_bias", (z + "dt_bias",)),
        NativeTensor(n + "norm.weight", (z + "o_norm.weight",)),
        NativeTensor(n + "out_proj.weight", (z + "o_proj.weight",)),
    ]


def _native_config(cfg: Any) -> dict[str, Any]:
    """Qwen3-Next / Qwen3.5's linear-attention sizes."""
    return {
        "linear_num_key_heads": cfg.gdn_num_heads,
        "linear_num_value_heads": cfg.gdn_num_v_heads,
        "linear_key_head_dim": cfg.gdn_head_dim,
        "linear_value_head_dim": cfg.gdn_head_v_dim,
        "linear_conv_kernel_dim": cfg.gdn_conv_size,
    }


def _tiled(cfg: Any, width: int) -> Callable[[Any], Any]:
    """Value-head rows grouped by key head `[k0: v0..v(r-1) | k1: ...]` (Zebra, FLA) -> tiled `[v0 of k0, v0 of
    k1, ..., v1 of k0, ...]`, the order llama.cpp's broadcast of the H key heads over HV value heads reads."""
    H, r = cfg.gdn_num_heads, cfg.gdn_num_v_heads // cfg.gdn_num_heads

    def reorder(t: Any) -> Any:  # [HV * width, ...]
        return t.reshape(H, r, width, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    return reorder


def _gguf_blockers(cfg: Any) -> list[Blocker]:
    out = _native_blockers(cfg)
    if cfg.gdn_head_v_dim != cfg.gdn_head_dim:
        why = "its loader sizes value heads by the key head dim"
        out.append(Blocker("model.gdn.head_v_dim", cfg.gdn_head_v_dim, cfg.gdn_head_dim, why))
    return out + eps_blocker(cfg, L2NORM_EPS, "its q/k L2 norm uses the model epsilon, Zebra's uses 1e-6")


def _gguf_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    """llama.cpp's qwen35 linear-attention block: value heads tiled, q/k/v fused, per-head vectors as columns."""
    value, head = _tiled(cfg, cfg.gdn_head_v_dim), _tiled(cfg, 1)

    def qkv(parts: list[Any]) -> Any:  # rows [q | k | v], v tiled; conv: [C, 1, W] -> [C, W]
        q, k, v = (p.reshape(p.shape[0], -1) for p in parts)
        return concat([q, k, value(v)])

    return [
        NativeTensor(b + "attn_qkv.weight", weights(z, "q_proj", "k_proj", "v_proj"), qkv),
        NativeTensor(b + "attn_gate.weight", weights(z, "g_proj"), lambda p: value(p[0])),
        NativeTensor(b + "ssm_conv1d.weight", weights(z, "q_conv1d", "k_conv1d", "v_conv1d"), qkv),
        NativeTensor(b + "ssm_dt.bias", (z + "dt_bias",), lambda p: head(p[0])),
        NativeTensor(b + "ssm_a", (z + "A_log",), lambda p: head(neg_exp(p))),
        NativeTensor(b + "ssm_beta.weight", weights(z, "b_proj"), lambda p: head(p[0])),
        NativeTensor(b + "ssm_alpha.weight", weights(z, "a_proj"), lambda p: head(p[0])),
        NativeTensor(b + "ssm_norm.weight", (z + "o_norm.weight",)),
        NativeTensor(b + "ssm_out.weight", weights(z, "o_proj"), lambda p: value(p[0].T).T),
    ]


GDN = register_mixer(
    MixerSpec(
        char="G",
        name="gdn",
        label="GDN",
        title="Gated DeltaNet",
        layer="zebra.models.layers.gated_deltanet.GatedDeltaNet",
        params=_params,
        layer_args=("hidden_size", "norm_eps", "layer_idx", "backend"),
        state="recurrent",
        state_shapes=_state,
        config_prefix="gdn",
        fields=(
            ConfigField("num_heads", 8, "query/key heads", 1, HEADS),
            ConfigField("head_dim", 64, "query/key channels per head", 1, HEAD_DIM),
            ConfigField("num_v_heads", 16, "value heads (a multiple of num_heads)", 1, HEADS),
            ConfigField("head_v_dim", 64, "value channels per head", 1, HEAD_DIM),
            ConfigField("conv_size", 4, "short causal convolution width", 2, 8),
            ConfigField("allow_neg_eigval", False, "beta in (0, 2) instead of (0, 1)"),
        ),
        section="gdn",
        section_doc="Gated DeltaNet dimensions",
        check=_check,
        summary=lambda c: (
            f"{c.gdn_num_heads} key heads x {c.gdn_head_dim}, {c.gdn_num_v_heads} value heads x "
            f"{c.gdn_head_v_dim}, conv {c.gdn_conv_size}"
        ),
        fla=FLAAdapter(
            model_type="gated_deltanet",
            architecture="GatedDeltaNetForCausalLM",
            config_class="GatedDeltaNetConfig",
            layer_class="GatedDeltaNet",
            defaults={
                "num_v_heads": None,
                "head_dim": 256,
                "num_heads": 6,
                "expand_v": 2.0,
                "num_hidden_layers": 21,
                "use_gate": True,
            },
            to_zebra=_from_fla,
            from_zebra=_to_fla,
        ),
        megatron=MegatronAdapter(
            detect=lambda n: (
                {"mixer.in_proj.weight", "mixer.out_norm.weight"} <= n and "mixer.f_b_proj.weight" not in n
            ),
            fields=lambda arg, first: megatron_dims(arg, value_heads=True),
            keys=_MEGATRON_KEYS,
            dims=_dims,
            parts=(
                ("query", "key", "value", "z", "beta", "alpha"),
                ("query", "key", "value"),
            ),  # in_proj, conv1d
        ),
        upcycle=upcycle_from_attention(
            "GDN from attention follows Primus' hybrid upcycling (q, k, v, o copied); no published results",
            value_heads=True,
        ),
        native=NativeAdapter(
            tensors=_native_tensors,
            blockers=_native_blockers,
            config=_native_config,
            servable="1b-gdn-pure (--to qwen3-next / qwen3.5)",
        ),
        gguf=GgufAdapter(tensors=_gguf_tensors, blockers=_gguf_blockers),
    )
)
