"""Primus / Megatron-LM checkpoint names -> Zebra names, one table per sublayer kind.

Megatron numbers sublayers like Zebra (`decoder.layers.{i}` is `model.layers.{i}`), so `{i}` maps to itself.
Names come from Primus' hybrid stack (primus/backends/megatron/core/models/hybrid/: gated_delta_net.py,
kimi_delta_attention.py, hybrid_mamba_mla_layer_specs.py) and megatron-core 0.16 (ssm/mamba_mixer.py,
transformer/multi_latent_attention.py, transformer/mlp.py). Each sublayer's pre-norm lives in one of two
places depending on the layer spec, and both are accepted:

    TE spec (TELayerNormColumnParallelLinear)     local spec (WrappedTorchNorm / TENorm module)
    mixer.in_proj.layer_norm_weight                norm.weight                    (GDN, KDA, Mamba2)
    mlp.linear_fc1.layer_norm_weight               pre_mlp_layernorm.weight       (MLP)
    self_attention.linear_q_up_proj.layer_norm_weight   self_attention.q_layernorm.weight   (MLA q latent)
    self_attention.linear_kv_up_proj.layer_norm_weight  self_attention.kv_layernorm.weight  (MLA kv latent)
    input_layernorm.weight (MLA pre-norm, both specs)

Fused projections (row order as the Megatron modules split them in forward):
    GDN  in_proj  [q | k | v | gate (z) | beta | alpha]      conv1d [q | k | v]
    KDA  in_proj  [q | k | v | f_a | g_a | beta]              conv1d [q | k | v]
    MLP  linear_fc1 [gate | up]
Mamba2 keeps Megatron's fused in_proj / conv1d, so its names map 1:1.
"""

from __future__ import annotations

import functools

from zebra.convert.keymap import KeyMap, Reshape, Split
from zebra.mixers import MixerSpec, resolve

_L = "decoder.layers.{i}."
_Z = "model.layers.{i}."

COMMON = {
    "embedding.word_embeddings.weight": "model.embeddings.weight",
    "decoder.final_norm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}

_RECURRENT_NORM = {
    _L + "mixer.in_proj.layer_norm_weight": _Z + "norm.weight",
    _L + "norm.weight": _Z + "norm.weight",
}

GDN = {
    **_RECURRENT_NORM,
    _L + "mixer.in_proj.weight": Split(
        0,
        (_Z + "mixer.q_proj.weight", "gdn_key"),
        (_Z + "mixer.k_proj.weight", "gdn_key"),
        (_Z + "mixer.v_proj.weight", "gdn_value"),
        (_Z + "mixer.g_proj.weight", "gdn_value"),
        (_Z + "mixer.b_proj.weight", "gdn_v_heads"),
        (_Z + "mixer.a_proj.weight", "gdn_v_heads"),
    ),
    _L + "mixer.conv1d.weight": Split(
        0,
        (_Z + "mixer.q_conv1d.weight", "gdn_key"),
        (_Z + "mixer.k_conv1d.weight", "gdn_key"),
        (_Z + "mixer.v_conv1d.weight", "gdn_value"),
    ),
    _L + "mixer.A_log": _Z + "mixer.A_log",
    _L + "mixer.dt_bias": _Z + "mixer.dt_bias",
    _L + "mixer.out_norm.weight": _Z + "mixer.o_norm.weight",
    _L + "mixer.out_proj.weight": _Z + "mixer.o_proj.weight",
}

KDA = {
    **_RECURRENT_NORM,
    _L + "mixer.in_proj.weight": Split(
        0,
        (_Z + "mixer.q_proj.weight", "kda_key"),
        (_Z + "mixer.k_proj.weight", "kda_key"),
        (_Z + "mixer.v_proj.weight", "kda_value"),
        (_Z + "mixer.f_proj.0.weight", "kda_head_v"),
        (_Z + "mixer.g_proj.0.weight", "kda_head_v"),
        (_Z + "mixer.b_proj.weight", "kda_heads"),
    ),
    _L + "mixer.conv1d.weight": Split(
        0,
        (_Z + "mixer.q_conv1d.weight", "kda_key"),
        (_Z + "mixer.k_conv1d.weight", "kda_key"),
        (_Z + "mixer.v_conv1d.weight", "kda_value"),
    ),
    _L + "mixer.f_b_proj.weight": _Z + "mixer.f_proj.1.weight",
    _L + "mixer.g_b_proj.weight": _Z + "mixer.g_proj.1.weight",
    _L + "mixer.g_b_proj.bias": _Z + "mixer.g_proj.1.bias",
    _L + "mixer.A_log": Reshape(_Z + "mixer.A_log", ("kda_heads",)),  # Primus stores [1, 1, H, 1]
    _L + "mixer.dt_bias": _Z + "mixer.dt_bias",
    _L + "mixer.out_norm.weight": _Z + "mixer.o_norm.weight",
    _L + "mixer.out_proj.weight": _Z + "mixer.o_proj.weight",
    _L + "mixer.gate_norm.weight": None,  # built by the TE spec but never called in forward
}

MAMBA2 = {
    **_RECURRENT_NORM,
    **{
        _L + f"mixer.{name}": _Z + f"mixer.{name}"
        for name in (
            "in_proj.weight",
            "conv1d.weight",
            "conv1d.bias",
            "A_log",
            "D",
            "dt_bias",
            "norm.weight",
            "out_proj.weight",
        )
    },
}

_SA = _L + "self_attention."
_ZM = _Z + "mixer."
MLA = {
    _L + "input_layernorm.weight": _Z + "norm.weight",
    _SA + "linear_q_proj.weight": _ZM + "q_proj.weight",
    _SA + "linear_q_down_proj.weight": _ZM + "q_down_proj.weight",
    _SA + "linear_q_up_proj.layer_norm_weight": _ZM + "q_norm.weight",
    _SA + "q_layernorm.weight": _ZM + "q_norm.weight",
    _SA + "linear_q_up_proj.weight": _ZM + "q_up_proj.weight",
    _SA + "linear_kv_down_proj.weight": _ZM + "kv_down_proj.weight",
    _SA + "linear_kv_up_proj.layer_norm_weight": _ZM + "kv_norm.weight",
    _SA + "kv_layernorm.weight": _ZM + "kv_norm.weight",
    _SA + "linear_kv_up_proj.weight": _ZM + "kv_up_proj.weight",
    _SA + "linear_proj.weight": _ZM + "o_proj.weight",
}

MLP = {
    _L + "mlp.linear_fc1.layer_norm_weight": _Z + "norm.weight",
    _L + "pre_mlp_layernorm.weight": _Z + "norm.weight",
    _L + "mlp.linear_fc1.weight": Split(
        0, (_Z + "mixer.gate_proj.weight", "ffn"), (_Z + "mixer.up_proj.weight", "ffn")
    ),
    _L + "mlp.linear_fc2.weight": _Z + "mixer.down_proj.weight",
}

DROPPED = {
    "{*}._extra_state": None,  # Transformer Engine FP8 metadata
}


def keymap_of(mixer: MixerSpec) -> KeyMap:
    """The key map of one sublayer kind: the table its Megatron adapter names (`MegatronAdapter.keys`), with
    COMMON and DROPPED, which apply everywhere."""
    return _keymap(mixer.megatron.keys)


@functools.cache
def _keymap(path: str) -> KeyMap:
    return KeyMap({**COMMON, **resolve(path), **DROPPED})


GLOBAL = KeyMap({**COMMON, **DROPPED})

# torch_dist checkpoints store fused tensors as parts (`in_proj.weight.query`, ...) through Megatron's
# ShardedTensorFactory; these are the part names in row order, per module.
SPLIT_FACTORIES: tuple[tuple[str, ...], ...] = (
    ("query", "key", "value", "z", "beta", "alpha"),  # Primus GatedDeltaNet.in_proj
    ("query", "key", "value", "f_a", "g_a", "beta"),  # Primus KimiDeltaAttention.in_proj
    ("query", "key", "value"),  # GDN / KDA conv1d
    ("z", "x", "B", "C", "dt"),  # megatron-core MambaMixer.in_proj
    ("x", "B", "C"),  # MambaMixer conv1d weight and bias
)
# The MLP's linear_fc1 with `singleton_local_shards` is saved as `linear_fc1.weight_w` / `_v` ([gate; up]).
SWIGLU_PARTS = ("_w", "_v")
