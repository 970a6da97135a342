"""The teacher as a Hugging Face causal LM (`build_teacher_model`), for distillation and SMART's scores.

The model is rebuilt from the teacher's shape (an HF folder or hub id: from its own config.json, so RoPE scaling is
kept) on the meta device and filled tensor by tensor from the teacher's reader, each cast as it is read.
`build_sharded_teacher_model` does the same under FSDP2: the model is sharded on the meta device first, and each
tensor is read, sharded and copied in before the next is read, so no rank ever holds the whole teacher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import torch

    from zebra.upcycle.teachers.teacher import Teacher, TeacherShape


def teacher_dtype(device: torch.device) -> torch.dtype:
    """The dtype a teacher runs in on `device`: float32 on the CPU, bf16 on a GPU."""
    import torch

    return torch.float32 if device.type == "cpu" else torch.bfloat16


def build_teacher_model(teacher: Teacher, dtype: torch.dtype) -> torch.nn.Module:
    """The HF causal LM of `teacher` in `dtype`, read tensor by tensor (each cast as it is read)."""
    import torch

    model = _on_meta(teacher, dtype)
    state = {name: teacher.tensors.get(name).to(dtype) for name in teacher.tensors.shapes()}
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    _remake_buffers(model, torch.device("cpu"))
    return model


def build_sharded_teacher_model(
    teacher: Teacher, dtype: torch.dtype, device: torch.device
) -> torch.nn.Module:
    """The HF causal LM of `teacher` in `dtype` on `device`, sharded with FSDP2 over every rank of the default
    process group (each decoder layer, then the root; parameters freed after each forward). Each tensor is read,
    cast, moved and sharded on its own: a rank's peak is its shard of the model plus one full tensor."""
    import torch
    from torch.distributed import get_world_size
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    model = _on_meta(teacher, dtype).requires_grad_(False)  # frozen before sharding: FSDP2 copies the flag
    model.tie_weights()
    mesh = init_device_mesh(device.type, (get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)  # no backward: free everything after use
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights come once, under their first name
            full = teacher.tensors.get(name).to(device=device, dtype=dtype)
            param.copy_(distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None))
            del full
        stored = teacher.tensors.shapes()
        for name, buffer in model.named_buffers():  # persistent buffers (none in Llama or Qwen3): not sharded
            if name in stored:
                buffer.copy_(teacher.tensors.get(name).to(device=device, dtype=buffer.dtype))
    _remake_buffers(model, device)
    return model


def _on_meta(teacher: Teacher, dtype: torch.dtype) -> torch.nn.Module:
    """The teacher's HF model on the meta device, once its reader is known to hold exactly the model's tensors (a
    tied head may be absent): else a one-line error naming the first tensor missing or left over."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_hf_config(teacher), dtype=dtype)
    wanted = set(model.state_dict())
    if model.config.tie_word_embeddings:
        wanted.discard("lm_head.weight")
    names = set(teacher.tensors.shapes())
    missing, unexpected = sorted(wanted - names), sorted(names - wanted - {"lm_head.weight"})
    if missing or unexpected:
        raise ZebraError(
            f"distill.teacher {teacher.origin}: "
            + (f"no tensor for {missing[0]}" if missing else f"unexpected tensor {unexpected[0]}"),
            fix="point at a complete dense Llama-family checkpoint",
        )
    return model


def _remake_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Every non-persistent buffer (the RoPE frequencies, made on the meta device or left empty by `to_empty`)
    computed again."""
    for name, _ in list(model.named_buffers()):
        module, _, attr = name.rpartition(".")
        owner = model.get_submodule(module)
        if attr in owner._non_persistent_buffers_set:
            owner.register_buffer(attr, _remade(owner, attr).to(device), persistent=False)


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
