"""Dense Primus / Megatron-LM GPT checkpoints (`torch` and `torch_dist`, TP = PP = 1 or any torch_dist) as teachers.

Megatron-core's names (GPTModel, TE or local layer spec) -> the HF names of `zebra.upcycle.teachers.teacher`:

    embedding.word_embeddings.weight                       model.embed_tokens.weight
    decoder.layers.{i}.self_attention.linear_qkv.weight    q_proj, k_proj, v_proj: rows interleaved per query
                                                           group g: [q heads of g | k_g | v_g] (+ .bias)
    decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight | input_layernorm.weight   input_layernorm
    decoder.layers.{i}.self_attention.{q,k}_layernorm.weight   q_norm, k_norm (qk_layernorm)
    decoder.layers.{i}.self_attention.linear_proj.weight   o_proj
    decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight | pre_mlp_layernorm.weight   post_attention_layernorm
    decoder.layers.{i}.mlp.linear_fc1.weight               [gate; up]
    decoder.layers.{i}.mlp.linear_fc2.weight               down_proj
    decoder.final_layernorm.weight                         model.norm.weight
    output_layer.weight                                    lm_head.weight (absent, or an unused copy, when tied)

With `rotary_interleaved` the q/k rows of each head are pair-interleaved; they are permuted to rotate-half here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from zebra.convert.keymap import Piece
from zebra.convert.tensor_sources import ConvertedSource, Shapes
from zebra.core.errors import ZebraError
from zebra.upcycle.teachers.teacher import Teacher, TeacherShape, check_tensors, layer_key

_NOT_DENSE_FIX = "upcycle a dense GPT (Llama-style: RMSNorm, SwiGLU, RoPE) Megatron checkpoint"


def open_megatron_teacher(path: Path, *, with_tokenizer: bool = True) -> Teacher:
    """Open a dense Megatron checkpoint (root, iteration folder or `model_optim_rng.pt`)."""
    from zebra.convert.megatron import is_torch_dist, is_torch_format, open_megatron, resolve_iteration_dir

    if path.is_dir() and not (is_torch_dist(d := resolve_iteration_dir(path)) or is_torch_format(d)):
        raise ZebraError(
            f"{path}: neither an HF model folder (no config.json) nor a Megatron checkpoint",
            fix="point at a folder with config.json + safetensors, a .gguf file or a Megatron checkpoint",
        )
    raw, state, fmt, directory = open_megatron(path)
    origin = raw.origin
    shapes = {k: v for k, v in raw.shapes().items() if not k.endswith("._extra_state")}
    args = state["args"]
    shape = _shape(args, shapes, origin)
    pieces = _pieces(shape, shapes, bool(getattr(args, "rotary_interleaved", False)), origin)
    source = ConvertedSource(raw, pieces)
    check_tensors(shape, {p.name: p.shape for p in pieces}, origin)
    tokenizer = None
    named = getattr(args, "tokenizer_type", "") == "HuggingFaceTokenizer" and getattr(
        args, "tokenizer_model", None
    )
    if with_tokenizer and named:
        from zebra.data.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(str(args.tokenizer_model))
    dtype = shapes["embedding.word_embeddings.weight"][1]
    return Teacher(
        shape, source, tokenizer, str(path), f"megatron-{fmt}", dtype, notes=[f"read from {directory}"]
    )


def _shape(args: Any, shapes: Shapes, origin: str) -> TeacherShape:
    """The teacher's shape from Megatron's saved arguments; refuses hybrids, MoE, MLA and non-Llama variants."""
    hybrid = next((k for k in shapes if ".mixer." in k or "linear_kv_down_proj" in k), None)
    if hybrid is not None or getattr(args, "is_hybrid_model", False):
        raise ZebraError(
            f"{origin}: a hybrid / MLA checkpoint ({hybrid or 'is_hybrid_model'}), not a dense GQA Transformer",
            fix="convert it with `zebra convert`; upcycle the dense model it came from",
        )
    if getattr(args, "num_experts", None):
        raise ZebraError(
            f"{origin}: a mixture-of-experts checkpoint (num_experts={args.num_experts})", fix=_NOT_DENSE_FIX
        )
    for name, want in (("normalization", "RMSNorm"), ("swiglu", True), ("position_embedding_type", "rope")):
        if getattr(args, name, want) != want:
            raise ZebraError(f"{origin}: saved args say {name}={getattr(args, name)!r}", fix=_NOT_DENSE_FIX)
    for name in ("add_bias_linear", "attention_output_gate", "apply_layernorm_1p"):
        if getattr(args, name, False):
            raise ZebraError(
                f"{origin}: saved args set {name}, which a Llama-style model has not", fix=_NOT_DENSE_FIX
            )
    if float(getattr(args, "rotary_percent", 1.0)) != 1.0:
        raise ZebraError(
            f"{origin}: rotary_percent={args.rotary_percent}: RoPE on part of each head", fix=_NOT_DENSE_FIX
        )
    if "embedding.word_embeddings.weight" not in shapes:
        raise ZebraError(f"{origin}: no embedding.word_embeddings.weight", fix="use a complete checkpoint")
    heads = int(_arg(args, "num_attention_heads", origin))
    hidden = int(_arg(args, "hidden_size", origin))
    groups = int(args.num_query_groups) if getattr(args, "group_query_attention", False) else heads
    max_pos = getattr(args, "max_position_embeddings", None) or _arg(args, "seq_length", origin)
    return TeacherShape(
        vocab_size=shapes["embedding.word_embeddings.weight"][0][0],
        hidden_size=hidden,
        intermediate_size=int(_arg(args, "ffn_hidden_size", origin)),
        num_layers=int(_arg(args, "num_layers", origin)),
        num_heads=heads,
        num_kv_heads=groups,
        head_dim=int(getattr(args, "kv_channels", None) or hidden // heads),
        tie_word_embeddings=not bool(getattr(args, "untie_embeddings_and_output_weights", False)),
        rope_theta=float(getattr(args, "rotary_base", None) or 10000),
        rms_norm_eps=float(getattr(args, "norm_epsilon", None) or 1e-5),
        max_position_embeddings=int(max_pos),
        qkv_bias=bool(getattr(args, "add_qkv_bias", False)),
        qk_norm=bool(getattr(args, "qk_layernorm", False)),
    )


def _arg(args: Any, name: str, origin: str) -> Any:
    value = getattr(args, name, None)
    if value is None:
        raise ZebraError(
            f"{origin}: saved args have no {name}", fix="use a checkpoint saved by Megatron training"
        )
    return value


def _pieces(shape: TeacherShape, shapes: Shapes, interleaved: bool, origin: str) -> list[Piece]:
    """The HF-named tensors, each a view (or slice, or permutation) of one Megatron tensor."""
    pieces: list[Piece] = []

    def add(name: str, source: str | None, out_shape: tuple[int, ...] | None = None, transform=None) -> None:
        if source is not None:
            pieces.append(Piece(name, source, out_shape or shapes[source][0], shapes[source][1], transform))

    def first(*candidates: str) -> str | None:
        return next((c for c in candidates if c in shapes), None)

    add("model.embed_tokens.weight", "embedding.word_embeddings.weight")
    f, dh = shape.intermediate_size, shape.head_dim
    for i in range(shape.num_layers):
        m, sa = f"decoder.layers.{i}.", f"decoder.layers.{i}.self_attention."
        for suffix in ("weight", "bias"):
            fused = first(sa + "linear_qkv." + suffix)
            for part, rows in _qkv_rows(shape).items() if fused else ():
                split = _qkv_split(shape, part, interleaved and part != "v_proj")
                add(layer_key(i, f"self_attn.{part}.{suffix}"), fused, (rows, *shapes[fused][0][1:]), split)
        add(
            layer_key(i, "input_layernorm.weight"),
            first(sa + "linear_qkv.layer_norm_weight", m + "input_layernorm.weight"),
        )
        add(layer_key(i, "self_attn.o_proj.weight"), first(sa + "linear_proj.weight"))
        for ours, theirs in (("q_norm", "q_layernorm"), ("k_norm", "k_layernorm")):
            rotate = (lambda t: _interleaved_to_rotate_half(t, dh)) if interleaved else None
            add(layer_key(i, f"self_attn.{ours}.weight"), first(sa + f"{theirs}.weight"), None, rotate)
        norm = first(m + "mlp.linear_fc1.layer_norm_weight", m + "pre_mlp_layernorm.weight")
        add(layer_key(i, "post_attention_layernorm.weight"), norm)
        fc1 = first(m + "mlp.linear_fc1.weight")
        if fc1 is not None:
            d = shapes[fc1][0][1]
            add(layer_key(i, "mlp.gate_proj.weight"), fc1, (f, d), lambda t: t[:f])
            add(layer_key(i, "mlp.up_proj.weight"), fc1, (f, d), lambda t: t[f:])
        add(layer_key(i, "mlp.down_proj.weight"), first(m + "mlp.linear_fc2.weight"))
    add("model.norm.weight", first("decoder.final_layernorm.weight", "decoder.final_norm.weight"))
    if not shape.tie_word_embeddings:
        add("lm_head.weight", first("output_layer.weight"))
    used = {p.source for p in pieces} | {"output_layer.weight"}  # tied: Megatron may keep an unused copy
    unknown = sorted(k for k in shapes if k not in used)
    if unknown:
        raise ZebraError(
            f"{origin}: {unknown[0]} is not part of a dense GQA Transformer"
            + (f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else ""),
            fix=_NOT_DENSE_FIX,
        )
    return pieces


def _qkv_rows(shape: TeacherShape) -> dict[str, int]:
    return {
        "q_proj": shape.num_heads * shape.head_dim,
        "k_proj": shape.num_kv_heads * shape.head_dim,
        "v_proj": shape.num_kv_heads * shape.head_dim,
    }


def _qkv_split(shape: TeacherShape, part: str, to_rotate_half: bool):
    """A transform: fused `linear_qkv` [G * (H/G + 2) * Dh, ...] -> the rows of q, k or v in HF order."""
    groups, per_group, dh = shape.num_kv_heads, shape.queries_per_kv, shape.head_dim

    def split(t: torch.Tensor) -> torch.Tensor:
        fused = t.reshape(groups, (per_group + 2) * dh, *t.shape[1:])  # [G, (H/G + 2) * Dh, ...]
        q, k, v = fused.split([per_group * dh, dh, dh], dim=1)
        rows = {"q_proj": q, "k_proj": k, "v_proj": v}[part].reshape(-1, *t.shape[1:])  # [heads * Dh, ...]
        return _interleaved_to_rotate_half(rows, dh) if to_rotate_half else rows

    return split


def _interleaved_to_rotate_half(rows: torch.Tensor, dh: int) -> torch.Tensor:
    """Per head of `dh` rows: pair-interleaved (2j, 2j+1) -> rotate-half (j, j + dh/2)."""
    heads = rows.reshape(-1, dh // 2, 2, *rows.shape[1:])  # [heads, Dh/2, 2, ...]
    return heads.transpose(1, 2).reshape(rows.shape)
