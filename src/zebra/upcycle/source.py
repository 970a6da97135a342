"""`UpcycledSource`: the student's tensors, made one sublayer at a time while the export writer asks for them.

The export writer fetches tensors in `shapes()` order (embeddings, sublayer 0, 1, ..., final norm, head), so the
source holds one sublayer's teacher tensors and student tensors at a time: peak memory is one layer on top of
whatever the teacher's reader keeps (memory-mapped safetensors / torch files, or one dequantised GGUF tensor).

Sublayer 2i (mixer) comes from teacher layer i's attention and input norm; sublayer 2i+1 (MLP) is teacher
layer i's MLP and post-attention norm, copied. The embeddings, the final norm and the output head are copied.
"""

from __future__ import annotations

from typing import Any

import torch

from zebra.convert.tensor_sources import Shapes, TensorSource
from zebra.mixers import ATTENTION, MLP, mixer_spec, resolve
from zebra.upcycle.attention import Made, TeacherAttention
from zebra.upcycle.mla import mla_from_gqa
from zebra.upcycle.report import COPIED, TensorOrigin
from zebra.upcycle.teachers.teacher import EMBED, FINAL_NORM, LM_HEAD, Teacher, layer_key

GLOBAL_COPIES = {"model.embeddings.weight": EMBED, "model.norm.weight": FINAL_NORM, LM_HEAD: LM_HEAD}
_MLP_COPIES = {
    "norm.weight": "post_attention_layernorm.weight",
    "mixer.gate_proj.weight": "mlp.gate_proj.weight",
    "mixer.up_proj.weight": "mlp.up_proj.weight",
    "mixer.down_proj.weight": "mlp.down_proj.weight",
}


class UpcycledSource(TensorSource):
    """The student of `teacher` with config `config` (a ZebraConfig), every tensor in `dtype`.

    Args:
        teacher: the opened teacher.
        config: the student's ZebraConfig (pattern: mixer/MLP pairs, one per teacher layer).
        dtype: the student's dtype (floating tensors); copies of same-dtype teacher tensors stay bit-equal.
        seed: seeds the mixers' own initialisation (per sublayer, so the result does not depend on read order).
        moments: {dense layer: the second moment of its attention input on calibration text}, for an activation-
            aware SVD of those MLA layers (`zebra.upcycle.calibration`); None: the plain SVD.
    """

    def __init__(
        self,
        teacher: Teacher,
        config: Any,
        dtype: torch.dtype,
        seed: int = 0,
        moments: dict[int, torch.Tensor] | None = None,
    ):
        from zebra.models import ZebraForCausalLM

        self.teacher, self.config, self.dtype, self.seed = teacher, config, dtype, seed
        self.moments = moments or {}
        self.origin = teacher.origin
        with torch.device("meta"):
            self._meta_model = ZebraForCausalLM(
                config
            )  # the names, shapes and `_init_weights` of the student
        self._shapes: Shapes = {
            name: (tuple(t.shape), dtype if t.is_floating_point() else t.dtype)
            for name, t in self._meta_model.state_dict().items()
            if not (config.tie_word_embeddings and name == LM_HEAD)
        }
        self.origins: dict[str, TensorOrigin] = {}
        self._current: tuple[int, dict[str, Made]] | None = None

    def shapes(self) -> Shapes:
        return dict(self._shapes)

    def get(self, name: str) -> torch.Tensor:
        if name in GLOBAL_COPIES:
            tensor, self.origins[name] = self._copy(name, GLOBAL_COPIES[name])
            return tensor
        index = int(name.split(".")[2])  # model.layers.{index}....
        if self._current is None or self._current[0] != index:
            self._current = None  # drop the previous sublayer first
            self._current = (index, self._sublayer(index))
        tensor, origin = self._current[1][name]
        self.origins[name] = origin
        return tensor

    def close(self) -> None:
        self._current = None

    def _sublayer(self, index: int) -> dict[str, Made]:
        """Every tensor of sublayer `index`."""
        layer, prefix = index // 2, f"model.layers.{index}."
        if self.config.layer_pattern[index] == MLP:
            return {
                prefix + ours: self._copy(prefix + ours, layer_key(layer, theirs))
                for ours, theirs in _MLP_COPIES.items()
            }
        out = {
            prefix + "norm.weight": self._copy(
                prefix + "norm.weight", layer_key(layer, "input_layernorm.weight")
            )
        }
        attn = TeacherAttention.read(self.teacher.tensors, self.teacher.shape, layer)
        kind, mixer = self.config.layer_pattern[index], prefix + "mixer."
        if kind == ATTENTION:
            out.update(mla_from_gqa(attn, mixer, self.config, self.dtype, self.moments.get(layer)))
            return out
        from_attention = resolve(mixer_spec(kind).upcycle.copy)  # the mixer's weight copy
        out.update(from_attention(attn, self._initialised(index), mixer, self.dtype))
        return out

    def _copy(self, name: str, source: str) -> Made:
        tensor = self.teacher.tensors.get(source).to(self.dtype)
        return tensor, TensorOrigin(name, list(tensor.shape), COPIED, source)

    def _initialised(self, index: int) -> dict[str, torch.Tensor]:
        """Sublayer `index` as `ZebraForCausalLM` initialises it (float32), seeded by `seed` and `index`."""
        from zebra.models.modeling_zebra import ZebraSublayer

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + index)
            sublayer = ZebraSublayer(self.config, index)
            for module in sublayer.modules():
                self._meta_model._init_weights(module)
        return {f"model.layers.{index}.{k}": v.detach() for k, v in sublayer.state_dict().items()}
