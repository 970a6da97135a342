"""The teacher: a dense GQA Transformer read tensor by tensor under one naming, whatever file it came from.

Every reader (`from_hf`, `from_gguf`, `from_megatron`) returns a `Teacher`: its shape (`TeacherShape`),
a lazy `TensorSource` whose names are Hugging Face Llama's, and its tokenizer. The query/key rows of each head are
in HF's rotate-half RoPE layout (channel j pairs with channel j + head_dim / 2), whatever the file stored.

Names (L layers, H query heads, Hkv key/value heads, head dim Dh, width D, MLP width F, vocabulary V):

    model.embed_tokens.weight                        [V, D]
    model.layers.{i}.input_layernorm.weight          [D]
    model.layers.{i}.self_attn.q_proj.weight         [H*Dh, D]      (+ .bias [H*Dh] with qkv_bias)
    model.layers.{i}.self_attn.k_proj.weight         [Hkv*Dh, D]    (+ .bias)
    model.layers.{i}.self_attn.v_proj.weight         [Hkv*Dh, D]    (+ .bias)
    model.layers.{i}.self_attn.q_norm.weight         [Dh]           (qk_norm: Qwen3's per-head RMSNorm)
    model.layers.{i}.self_attn.k_norm.weight         [Dh]
    model.layers.{i}.self_attn.o_proj.weight         [D, H*Dh]
    model.layers.{i}.post_attention_layernorm.weight [D]
    model.layers.{i}.mlp.{gate,up}_proj.weight       [F, D]
    model.layers.{i}.mlp.down_proj.weight            [D, F]
    model.norm.weight                                [D]
    lm_head.weight                                   [V, D]         absent when tied
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.errors import ZebraError
from zebra.mixers import MIXERS

if TYPE_CHECKING:
    import torch

    from zebra.convert.tensor_sources import TensorSource

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# model_type values of the Llama family: pre-norm RMSNorm, SwiGLU, rotate-half RoPE, separate q/k/v/o.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
# Model types that are something else a user may point at by mistake, with what they are.
NOT_DENSE = {
    "zebra": "a Zebra export (already a hybrid)",
    **dict.fromkeys(
        (
            *(s.fla.model_type for s in MIXERS.values() if s.fla),  # what `zebra convert` reads
            *("delta_net", "gsa", "hgrn", "hgrn2", "retnet", "rwkv6", "rwkv7"),
        ),
        "an FLA model (recurrent layers, no attention to upcycle)",
    ),
    **dict.fromkeys(("mamba", "mamba2", "samba", "jamba", "zamba", "zamba2"), "a state-space model"),
}


def layer_key(i: int, name: str) -> str:
    """`model.layers.{i}.{name}`, e.g. layer_key(3, "self_attn.q_proj.weight")."""
    return f"model.layers.{i}.{name}"


@dataclass(frozen=True)
class TeacherShape:
    """What the student's shapes come from, read from the teacher's config (or Megatron's saved args)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    qkv_bias: bool = False  # Qwen2: q/k/v projections with biases
    qk_norm: bool = False  # Qwen3: an RMSNorm over each query/key head before RoPE
    rope_scaling: str | None = None  # the teacher's RoPE scaling type (e.g. llama3), for the report
    rope_factor: float = 1.0  # its context extension factor (llama3, yarn, linear...); 1.0 = none
    rope_original_max: int | None = None  # the context it was pre-trained at, before the extension
    special_ids: dict[str, Any] = field(default_factory=dict)  # bos / eos / pad token ids

    @property
    def queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def params(self) -> int:
        """Parameters of the teacher (its norms and, when untied, its output head included)."""
        d, h, kv, dh = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        attention = 2 * d * h * dh + 2 * d * kv * dh + (2 * dh if self.qk_norm else 0)
        attention += (h + 2 * kv) * dh if self.qkv_bias else 0
        layer = attention + 3 * d * self.intermediate_size + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + head + self.num_layers * layer + d


@dataclass
class Teacher:
    """An opened teacher: shape, tensors under the names above (read lazily), tokenizer, provenance."""

    shape: TeacherShape
    tensors: TensorSource
    tokenizer: Any  # a transformers tokenizer, or None when the checkpoint names none
    origin: str  # the path or hub id as opened
    format: str  # "hf", "gguf", "megatron-torch", "megatron-torch_dist"
    dtype: torch.dtype  # the dtype of its weights (GGUF: float32, dequantised)
    notes: list[str] = field(default_factory=list)


def resolve_teacher_spec(spec: str) -> str:
    """An existing local path made absolute (ranks and containers start elsewhere); a hub id unchanged."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def shape_from_hf_config(cfg: dict[str, Any], origin: str) -> TeacherShape:
    """A `TeacherShape` from an HF config.json dict; refuses anything but a dense Llama-family GQA model."""
    model_type = str(cfg.get("model_type", ""))
    what = NOT_DENSE.get(model_type)
    if what is None and ("moe" in model_type or _num_experts(cfg)):
        what = "a mixture-of-experts model"
    if what is not None:
        raise ZebraError(
            f"{origin}: model_type {model_type!r} is {what}, not a dense GQA Transformer",
            fix="upcycle a dense Llama-family model (Llama 3.x, Qwen2/Qwen3, SmolLM2, Mistral)",
        )
    if model_type not in LLAMA_FAMILY:
        raise ZebraError(
            f"{origin}: model_type {model_type!r} is not a Llama-family Transformer",
            fix=f"zebra upcycles {', '.join(LLAMA_FAMILY)} models (SwiGLU, RMSNorm, rotate-half RoPE)",
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise ZebraError(
            f"{origin}: hidden_act {cfg['hidden_act']!r}; the student's MLP is SwiGLU (silu)",
            fix="upcycle a model whose MLP uses silu",
        )
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0
    kind = rope.get("rope_type") or rope.get("type")
    return TeacherShape(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=float(theta),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 8192),
        qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type == "qwen3",
        rope_scaling=None if kind in (None, "default") else str(kind),
        rope_factor=float(rope.get("factor") or 1.0) if kind not in (None, "default") else 1.0,
        rope_original_max=int(rope["original_max_position_embeddings"])
        if rope.get("original_max_position_embeddings")
        else None,
        special_ids={k: cfg.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg},
    )


def _num_experts(cfg: dict[str, Any]) -> int:
    keys = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    return max(int(cfg.get(k) or 0) for k in keys)


def expected_shapes(shape: TeacherShape) -> dict[str, tuple[int, ...]]:
    """Every tensor a teacher of `shape` holds, with its shape (names: the module docstring)."""
    d, f, dh = shape.hidden_size, shape.intermediate_size, shape.head_dim
    q, kv = shape.num_heads * dh, shape.num_kv_heads * dh
    out: dict[str, tuple[int, ...]] = {EMBED: (shape.vocab_size, d)}
    for i in range(shape.num_layers):
        layer = {
            "input_layernorm.weight": (d,),
            "self_attn.q_proj.weight": (q, d),
            "self_attn.k_proj.weight": (kv, d),
            "self_attn.v_proj.weight": (kv, d),
            "self_attn.o_proj.weight": (d, q),
            "post_attention_layernorm.weight": (d,),
            "mlp.gate_proj.weight": (f, d),
            "mlp.up_proj.weight": (f, d),
            "mlp.down_proj.weight": (d, f),
        }
        if shape.qkv_bias:
            layer.update(
                {f"self_attn.{p}.bias": (n,) for p, n in (("q_proj", q), ("k_proj", kv), ("v_proj", kv))}
            )
        if shape.qk_norm:
            layer.update({"self_attn.q_norm.weight": (dh,), "self_attn.k_norm.weight": (dh,)})
        out.update({layer_key(i, k): v for k, v in layer.items()})
    out[FINAL_NORM] = (d,)
    if not shape.tie_word_embeddings:
        out[LM_HEAD] = (shape.vocab_size, d)
    return out


def check_tensors(shape: TeacherShape, found: dict[str, tuple[int, ...]], origin: str) -> None:
    """Raise one ZebraError naming what the tensors lack or hold beyond a dense GQA Transformer of `shape`."""
    if shape.num_heads % shape.num_kv_heads:
        raise ZebraError(
            f"{origin}: {shape.num_heads} query heads are not a multiple of {shape.num_kv_heads} KV heads",
            fix="upcycle a grouped-query (GQA) or multi-head attention model",
        )
    expected = expected_shapes(shape)
    experts = sorted(k for k in found if ".experts." in k or ".router." in k or ".gate.weight" in k)
    if experts:
        raise ZebraError(
            f"{origin}: holds {experts[0]} (mixture-of-experts layers), not a dense GQA Transformer",
            fix="upcycle a dense Llama-family model",
        )
    missing = [k for k in expected if k not in found]
    wrong = [
        f"{k} {list(found[k])} (expected {list(v)})"
        for k, v in expected.items()
        if k in found and found[k] != v
    ]
    unexpected = [k for k in found if k not in expected and not (k == LM_HEAD and shape.tie_word_embeddings)]
    problems = [f"missing {k}" for k in missing[:3]] + wrong[:3] + [f"unexpected {k}" for k in unexpected[:3]]
    if problems:
        more = len(missing) + len(wrong) + len(unexpected) - len(problems)
        raise ZebraError(
            f"{origin}: not a dense GQA Transformer of the configured shape: {'; '.join(problems)}"
            + (f" (+{more} more)" if more > 0 else ""),
            fix="point at a complete Llama-family checkpoint whose config matches its weights",
        )
