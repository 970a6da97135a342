"""The teacher as a Hugging Face causal LM (`build_teacher_model`), for distillation and SMART's scores.

The model is rebuilt from the teacher's shape (an HF folder or hub id: from its own config.json, so RoPE scaling is
kept) on the meta device and filled tensor by tensor from the teacher's reader, each cast as it is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zebra.errors import ZebraError

if TYPE_CHECKING:
    import torch

    from zebra.upcycle.teacher import Teacher, TeacherShape


def build_teacher_model(teacher: Teacher, dtype: torch.dtype) -> torch.nn.Module:
    """The HF causal LM of `teacher` in `dtype`, read tensor by tensor (each cast as it is read)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_hf_config(teacher), dtype=dtype)
    names = teacher.tensors.shapes()
    state = {name: teacher.tensors.get(name).to(dtype) for name in names}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ZebraError(
            f"distill.teacher {teacher.origin}: "
            + (f"no tensor for {missing[0]}" if missing else f"unexpected tensor {unexpected[0]}"),
            fix="point at a complete dense Llama-family checkpoint",
        )
    model.tie_weights()
    for name, buffer in list(model.named_buffers()):  # RoPE frequencies: made on the meta device, remake
        if buffer.is_meta:
            module, _, attr = name.rpartition(".")
            owner = model.get_submodule(module)
            owner.register_buffer(attr, _remade(owner, attr), persistent=False)
    return model


def _remade(rotary: torch.nn.Module, attr: str) -> torch.Tensor:
    """A rotary embedding's meta buffer computed again on the CPU (transformers' rope init function)."""
    import torch

    with torch.device("cpu"):
        fresh = type(rotary)(rotary.config)
    return getattr(fresh, attr)


def _hf_config(teacher: Teacher) -> Any:
    """The teacher's HF config: an HF folder's own (RoPE scaling included), else rebuilt from its shape."""
    from transformers import AutoConfig

    if teacher.format == "hf":
        return AutoConfig.from_pretrained(teacher.origin)
    return hf_config_from_shape(teacher.shape)


def hf_config_from_shape(s: TeacherShape, **overrides: Any) -> Any:
    """An HF config (Qwen3 when the teacher has per-head q/k norms, else Llama) of a teacher's shape; `overrides`
    (other config keys, or the same ones) win."""
    from transformers import AutoConfig

    fields = dict(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        tie_word_embeddings=s.tie_word_embeddings,
        rope_theta=s.rope_theta,
        rms_norm_eps=s.rms_norm_eps,
        max_position_embeddings=s.max_position_embeddings,
        attention_bias=s.qkv_bias,
    )
    return AutoConfig.for_model("qwen3" if s.qk_norm else "llama", **{**fields, **overrides})
