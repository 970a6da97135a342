"""The SwiGLU MLP, the `-` sublayer (`zebra.models.layers.swiglu`): sized by `intermediate_size`, no state."""

from __future__ import annotations

from zebra.mixers.spec import MLP, MegatronAdapter, MixerSpec, register_mixer

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
    )
)
