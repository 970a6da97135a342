"""One teacher attention layer, read once and handed to the per-mixer initialisations."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zebra.convert.tensor_sources import TensorSource
from zebra.upcycle.report import TensorOrigin
from zebra.upcycle.teachers.teacher import TeacherShape, layer_key

# A student tensor with the record of where it came from.
Made = tuple[torch.Tensor, TensorOrigin]


@dataclass
class TeacherAttention:
    """W_q [H*Dh, D], W_k and W_v [Hkv*Dh, D], W_o [D, H*Dh] of one layer, in the teacher's dtype.

    Qwen3's per-head q/k norm weights are folded into the rows of W_q / W_k (`folded_norms`); the per-token
    normalisation itself has no counterpart in the student.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    names: dict[str, str]  # "q", "k", "v", "o" -> teacher tensor name
    shape: TeacherShape
    folded_norms: bool = False

    @classmethod
    def read(cls, tensors: TensorSource, shape: TeacherShape, layer: int) -> TeacherAttention:
        names = {p: layer_key(layer, f"self_attn.{p}_proj.weight") for p in "qkvo"}
        w = {p: tensors.get(n) for p, n in names.items()}
        if shape.qk_norm:
            for p in "qk":
                norm = tensors.get(layer_key(layer, f"self_attn.{p}_norm.weight")).float()  # [Dh]
                rows = w[p].float().view(-1, shape.head_dim, w[p].shape[-1]) * norm[None, :, None]
                w[p] = rows.reshape(w[p].shape).to(w[p].dtype)
        return cls(w["q"], w["k"], w["v"], w["o"], names, shape, shape.qk_norm)

    def repeated(self, part: str) -> torch.Tensor:
        """W_k or W_v with each KV head's rows repeated for every query head of its group: [H*Dh, D]."""
        s = self.shape
        w = {"k": self.k, "v": self.v}[part]
        heads = w.view(s.num_kv_heads, 1, s.head_dim, w.shape[-1])  # [Hkv, 1, Dh, D]
        return heads.expand(-1, s.queries_per_kv, -1, -1).reshape(s.num_heads * s.head_dim, w.shape[-1])

    def source(self, part: str) -> str:
        """The teacher tensor behind `part`, for the report (with the folded norm, when there is one)."""
        name = self.names[part]
        return f"{name} * {part}_norm" if self.folded_norms and part in "qk" else name
