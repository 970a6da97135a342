"""The SwiGLU MLP, the `-` sublayer (`zebra.models.layers.swiglu`): sized by `intermediate_size`, no state."""

from __future__ import annotations

from typing import Any

from zebra.mixers.spec import (
    MEGATRON_LAYER,
    MLP,
    ZEBRA_LAYER,
    GgufAdapter,
    MegatronAdapter,
    MixerSpec,
    NativeAdapter,
    NativeTensor,
    Split,
    concat,
    register_mixer,
    weights,
)

_L, _Z = MEGATRON_LAYER, ZEBRA_LAYER
# megatron-core's MLP (transformer/mlp.py): linear_fc1 rows [gate | up]; the pre-norm TE-fused or its own module
_MEGATRON_KEYS = {
    _L + "mlp.linear_fc1.layer_norm_weight": _Z + "norm.weight",
    _L + "pre_mlp_layernorm.weight": _Z + "norm.weight",
    _L + "mlp.linear_fc1.weight": Split(
        0, (_Z + "mixer.gate_proj.weight", "ffn"), (_Z + "mixer.up_proj.weight", "ffn")
    ),
    _L + "mlp.linear_fc2.weight": _Z + "mixer.down_proj.weight",
}


def _native_tensors(cfg: Any, z: str, n: str, to: str) -> list[NativeTensor]:
    """The native classes' SwiGLU MLP has the same three projections, but Granite's `shared_mlp`, whose
    `input_linear` rows are [gate | up] (it chunks them in two, silu on the first)."""
    if to == "granite-hybrid":
        return [
            NativeTensor(n + "input_linear.weight", weights(z, "gate_proj", "up_proj"), concat),  # [2I, H]
            NativeTensor(n + "output_linear.weight", weights(z, "down_proj")),
        ]
    return [
        NativeTensor(f"{n}{p}.weight", (f"{z}{p}.weight",)) for p in ("gate_proj", "up_proj", "down_proj")
    ]


def _gguf_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    """llama.cpp's feed-forward tensors, the same in every architecture."""
    return [NativeTensor(f"{b}ffn_{p}.weight", weights(z, f"{p}_proj")) for p in ("gate", "up", "down")]


SWIGLU = register_mixer(
    MixerSpec(
        char=MLP,
        name="mlp",
        label="MLP",
        title="SwiGLU MLP",
        layer="zebra.models.layers.swiglu.SwiGLU",
        params=lambda c: 3 * c.hidden_size * c.intermediate_size,
        megatron=MegatronAdapter(
            detect=lambda names: any(n.startswith("mlp.") for n in names),
            fields=lambda arg, first: {},
            keys=_MEGATRON_KEYS,
            dims=lambda c: {"ffn": c.intermediate_size},
            pre_norms=("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"),
        ),
        native=NativeAdapter(tensors=_native_tensors),
        gguf=GgufAdapter(tensors=_gguf_tensors),
    )
)
