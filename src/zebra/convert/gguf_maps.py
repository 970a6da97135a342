"""What a Zebra model is in llama.cpp's GGUF: one `GgufArch` per llama.cpp architecture.

A GGUF block `i` is Zebra's sublayers `2i` (its mixer) and `2i + 1` (its SwiGLU MLP), as in the native exports
(`zebra.convert.native`). Each mixer's part lives in its registry module (`zebra.mixers.<name>`, the spec's
`gguf` adapter, a `GgufAdapter`): the settings llama.cpp cannot run exactly and the GGUF tensors, each built from
Zebra tensors by renaming, concatenation, row permutation or reshape, except the decay rates llama.cpp stores as
`-exp(A_log)` (computed in float64, rounded once). Each `GgufArch` here holds the mixers its loader builds and
writes its metadata (and the pass-through block below). Tensor names, shapes and keys are those of llama.cpp as
vendored by llama-cpp-python 0.3.36 (`src/models/{qwen35,granite-hybrid,kimi-linear}.cpp`,
`src/llama-arch.cpp`); GGUF lists shapes innermost first, so a numpy `[rows, cols]` matrix is llama.cpp's
`{cols, rows}`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zebra.mixers import MIXERS, MLP
from zebra.mixers.spec import Blocker, GgufAdapter, NativeTensor, mixer_named

# llama.cpp 0.3.36's hybrid memory fails on its first decode when no layer is attention (GGML_ASSERT(buffer) in
# llama_kv_cache::set_input_k_idxs: the attention inputs no layer reads are never allocated). A pure GDN or Mamba2
# model therefore gets one more block, last: an attention block and MLP whose every weight is zero. It adds exactly
# 0 to the residual stream (x + 0 == x in floating point), so the logits are unchanged, bit for bit.
PASS = "pass"


@dataclass(frozen=True)
class GgufArch:
    """One llama.cpp architecture (`general.architecture`).

    Attributes:
        name: the architecture name.
        mixers: the Zebra mixer kinds its layers hold.
        post_norm: the block's pre-MLP norm tensor.
        writes_output: `output.weight` is required even when the embedding is tied (else llama.cpp reuses it).
        metadata: `(cfg, block kinds, writer)` adds the architecture's keys (`PASS` marks a pass-through block).
        passthrough: `(cfg, block prefix) -> [(name, numpy shape)]`: an attention block of zeros, appended when
            no layer is attention (below).
    """

    name: str
    mixers: frozenset[str]
    post_norm: str
    writes_output: bool
    metadata: Callable[[Any, list[str], Any], None]
    passthrough: Callable[[Any, str], list[tuple[str, tuple[int, ...]]]] | None = None


# ---------------------------------------------------------------------------------------------- metadata
def _common(cfg: Any, kinds: list[str], w: Any) -> None:
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(len(kinds))
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)


def _head_dim(cfg: Any) -> int:
    return cfg.hidden_size // cfg.num_attention_heads  # llama.cpp's default attention head size


def _qwen35_passthrough(cfg: Any, b: str) -> list[tuple[str, tuple[int, ...]]]:
    D, H, hd, ff = cfg.hidden_size, cfg.num_attention_heads, _head_dim(cfg), cfg.intermediate_size
    return [(b + "attn_norm.weight", (D,)), (b + "attn_q.weight", (2 * H * hd, D)), (b + "attn_k.weight", (H * hd, D)),
            (b + "attn_v.weight", (H * hd, D)), (b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,)),
            (b + "attn_output.weight", (D, H * hd)), (b + "post_attention_norm.weight", (D,)),
            (b + "ffn_gate.weight", (ff, D)), (b + "ffn_up.weight", (ff, D)), (b + "ffn_down.weight", (D, ff))]  # fmt: skip


def _granite_passthrough(cfg: Any, b: str) -> list[tuple[str, tuple[int, ...]]]:
    D, H, hd, ff = cfg.hidden_size, cfg.num_attention_heads, _head_dim(cfg), cfg.intermediate_size
    return [(b + "attn_norm.weight", (D,)), (b + "attn_q.weight", (H * hd, D)), (b + "attn_k.weight", (hd, D)),
            (b + "attn_v.weight", (hd, D)), (b + "attn_output.weight", (D, H * hd)), (b + "ffn_norm.weight", (D,)),
            (b + "ffn_gate.weight", (ff, D)), (b + "ffn_up.weight", (ff, D)), (b + "ffn_down.weight", (D, ff))]  # fmt: skip


def _qwen35_metadata(cfg: Any, kinds: list[str], w: Any) -> None:
    _common(cfg, kinds, w)
    w.add_head_count(cfg.num_attention_heads)  # sizes the pass-through block's attention
    w.add_head_count_kv(cfg.num_attention_heads)
    w.add_ssm_conv_kernel(cfg.gdn_conv_size)
    w.add_ssm_state_size(cfg.gdn_head_dim)
    w.add_ssm_group_count(cfg.gdn_num_heads)
    sizes = mixer_named("gdn").megatron.dims(cfg)  # the mixer's own sizes: value heads, their total width
    w.add_ssm_time_step_rank(sizes["gdn_v_heads"])
    w.add_ssm_inner_size(sizes["gdn_value"])
    w.add_array(f"{w.arch}.attention.recurrent_layers", [k == "gdn" for k in kinds])
    w.add_rope_dimension_sections(
        [_head_dim(cfg) // 2, 0, 0, 0]
    )  # required; only the pass-through block reads it


def _granite_metadata(cfg: Any, kinds: list[str], w: Any) -> None:
    _common(cfg, kinds, w)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv([0 if k == "mamba2" else 1 for k in kinds])  # 0 key/value heads: a recurrent layer
    w.add_ssm_conv_kernel(cfg.mamba_conv_size)
    w.add_ssm_state_size(cfg.mamba_state_dim)
    w.add_ssm_group_count(cfg.mamba_num_groups)
    w.add_ssm_time_step_rank(cfg.mamba_expand * cfg.hidden_size // cfg.mamba_head_dim)
    w.add_ssm_inner_size(cfg.mamba_expand * cfg.hidden_size)


def _kimi_metadata(cfg: Any, kinds: list[str], w: Any) -> None:
    _common(cfg, kinds, w)
    w.add_head_count(cfg.kda_num_heads)
    w.add_head_count_kv([1 if k == "mla" else 0 for k in kinds])  # MLA as MQA over its latent; 0 = KDA
    w.add_ssm_conv_kernel(cfg.kda_conv_size)
    w.add_kda_head_dim(cfg.kda_head_dim)
    w.add_kv_lora_rank(cfg.kv_lora_rank)
    if cfg.q_lora_rank:
        w.add_q_lora_rank(cfg.q_lora_rank)
    w.add_rope_dimension_count(cfg.qk_rope_head_dim)  # the shared key part, used without rotation (NoPE)
    w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    w.add_value_length(cfg.kv_lora_rank)
    w.add_key_length_mla(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    w.add_value_length_mla(cfg.v_head_dim)
    w.add_leading_dense_block_count(len(kinds))  # every MLP dense (no experts)
    w.add_expert_feed_forward_length(cfg.intermediate_size)  # required keys; no expert exists
    w.add_expert_shared_count(0)
    w.add_uint32(f"{w.arch}.expert_gating_func", 2)  # sigmoid; unused without experts


GGUF_ARCHS: dict[str, GgufArch] = {
    a.name: a
    for a in (
        GgufArch(
            "qwen35", frozenset({"gdn"}), "post_attention_norm", False, _qwen35_metadata, _qwen35_passthrough
        ),
        GgufArch(
            "granitehybrid", frozenset({"mamba2"}), "ffn_norm", False, _granite_metadata, _granite_passthrough
        ),
        GgufArch("kimi-linear", frozenset({"kda", "mla"}), "ffn_norm", True, _kimi_metadata),
    )
}


def layer_kinds(cfg: Any) -> list[str]:
    """The mixer kind (registry name) of each of the model's layers."""
    return [MIXERS[c].name for c in cfg.layer_pattern[0::2]]


def block_kinds(cfg: Any, arch: GgufArch) -> list[str]:
    """The kind of each GGUF block: the model's layers, then `PASS` where a pass-through block is appended."""
    kinds = layer_kinds(cfg)
    return [*kinds, PASS] if arch.passthrough is not None else kinds


def zero_tensors(cfg: Any, arch: GgufArch) -> list[tuple[str, tuple[int, ...]]]:
    """The pass-through block's tensors (all zeros): (name, numpy shape)."""
    return [] if arch.passthrough is None else arch.passthrough(cfg, f"blk.{len(layer_kinds(cfg))}.")


def arch_for(cfg: Any) -> GgufArch | None:
    """The architecture whose layers hold every mixer kind of the model, if any."""
    kinds = set(layer_kinds(cfg))
    return next((a for a in GGUF_ARCHS.values() if kinds <= a.mixers), None)


def gguf_adapter(kind: str) -> GgufAdapter:
    """The GGUF adapter of the mixer kind `kind` (registry name); only kinds of a `GgufArch` reach here."""
    adapter = mixer_named(kind).gguf
    assert adapter is not None, f"mixer {kind!r} is in a GgufArch but has no gguf adapter"
    return adapter


def blockers(cfg: Any) -> list[Blocker]:
    """What stops an exact GGUF of the model (its mixers' settings)."""
    return [b for kind in dict.fromkeys(layer_kinds(cfg)) for b in gguf_adapter(kind).blockers(cfg)]


def plan(cfg: Any, arch: GgufArch, zebra_names: list[str]) -> list[NativeTensor]:
    """Every GGUF tensor, in block order, from the Zebra tensor names `zebra_names`."""
    out = [NativeTensor("token_embd.weight", ("model.embeddings.weight",))]
    for i, kind in enumerate(layer_kinds(cfg)):
        mixer, mlp, block = f"model.layers.{2 * i}.", f"model.layers.{2 * i + 1}.", f"blk.{i}."
        out.append(NativeTensor(block + "attn_norm.weight", (mixer + "norm.weight",)))
        out += gguf_adapter(kind).tensors(cfg, mixer + "mixer.", block)
        out.append(NativeTensor(f"{block}{arch.post_norm}.weight", (mlp + "norm.weight",)))
        out += gguf_adapter(MIXERS[MLP].name).tensors(cfg, mlp + "mixer.", block)
    out.append(NativeTensor("output_norm.weight", ("model.norm.weight",)))
    if "lm_head.weight" in zebra_names and not cfg.tie_word_embeddings:
        out.append(NativeTensor("output.weight", ("lm_head.weight",)))
    elif arch.writes_output:
        out.append(NativeTensor("output.weight", ("model.embeddings.weight",)))
    return out
