"""The SwiGLU MLP, the `-` sublayer (`zebra.models.layers.swiglu`): sized by `intermediate_size`, no state."""

from __future__ import annotations

from typing import Any

from zebra.mixers.spec import MLP, MegatronAdapter, MixerSpec, NativeAdapter, NativeTensor, register_mixer


def _native_tensors(cfg: Any, z: str, n: str, to: str) -> list[NativeTensor]:
    """Every native class's SwiGLU MLP has the same three projections."""
    return [
        NativeTensor(f"{n}{p}.weight", (f"{z}{p}.weight",)) for p in ("gate_proj", "up_proj", "down_proj")
    ]


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
            keys="zebra.convert.megatron_keys:MLP",
            pre_norms=("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"),
        ),
        native=NativeAdapter(tensors=_native_tensors),
    )
)
