"""Primus / Megatron-LM checkpoint names -> Zebra names: the keys every model has, and each sublayer kind's table
from its spec (`MegatronAdapter.keys`, in `zebra.mixers.<name>`).

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

Fused projections are cut in the row order the Megatron modules split them in forward (each table's `Split`).
"""

from __future__ import annotations

import functools

from zebra.convert.keymap import KeyMap
from zebra.mixers import MIXERS, MixerSpec, mixer_named

COMMON = {
    "embedding.word_embeddings.weight": "model.embeddings.weight",
    "decoder.final_norm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}

DROPPED = {
    "{*}._extra_state": None,  # Transformer Engine FP8 metadata
}


def keymap_of(mixer: MixerSpec) -> KeyMap:
    """The key map of one sublayer kind: its Megatron adapter's table (`MegatronAdapter.keys`), with COMMON and
    DROPPED, which apply everywhere."""
    return _keymap(mixer.name)


@functools.cache
def _keymap(name: str) -> KeyMap:
    return KeyMap({**COMMON, **mixer_named(name).megatron.keys, **DROPPED})


GLOBAL = KeyMap({**COMMON, **DROPPED})

# torch_dist checkpoints store fused tensors as parts (`in_proj.weight.query`, ...) through Megatron's
# ShardedTensorFactory; these are the part names in row order, per module (`MegatronAdapter.parts`).
SPLIT_FACTORIES: tuple[tuple[str, ...], ...] = tuple(
    dict.fromkeys(order for s in MIXERS.values() if s.megatron for order in s.megatron.parts)
)
# The MLP's linear_fc1 with `singleton_local_shards` is saved as `linear_fc1.weight_w` / `_v` ([gate; up]).
SWIGLU_PARTS = ("_w", "_v")
