"""Architecture arithmetic with no torch: layer patterns, parameter counts, decode-cache sizes, FLOPs.

Everything here reads a *flat* model configuration: any object with the attribute names of
`zebra.models.ZebraConfig` (the config itself, or `Recipe.model.flat()` wrapped in a namespace). It is imported
by `zebra recipes list` and must stay instant, so it imports nothing heavy.

A layer pattern has one character per sublayer (Megatron numbering), each a key of the mixer registry
`zebra.mixers.MIXERS`: `M` Mamba2, `G` Gated DeltaNet, `K` Kimi Delta Attention, `*` Multi-Latent Attention,
`-` SwiGLU MLP. Each sublayer is pre-norm residual: x = x + f(norm(x)); every mixer is followed by an MLP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from zebra.mixers import ATTENTION, MIXERS, MLP, MixerSpec, recurrent_spec

# The model-wide settings' defaults, by `ZebraConfig` key: what `ZebraConfig()` takes and what a recipe's `model`
# section without them means (the recipe's names for them: `zebra.recipes.schema.CONFIG_KEYS`; each mixer's
# sizes, MLA's among them: its `fields`, `zebra.mixers.<name>`).
MODEL_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "recurrent_type": "gdn",
    "hybrid_attention_ratio": 0.0,
    "layer_pattern": None,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "max_position_embeddings": 8192,
    "kernel_backend": "auto",
}
KERNEL_BACKENDS = (
    "auto",
    "torch",
    "fla",
    "mamba_ssm",
)  # `zebra_kernels.backend.BACKENDS`, which imports no zebra


def pattern_from_ratio(num_layers: int, ratio: float, recurrent_type: str) -> str:
    """The sublayer pattern Primus derives from `hybrid_attention_ratio` (reference.md section 1).

    >>> pattern_from_ratio(32, 0.25, "mamba2")
    '*-M-M-M-*-M-M-M-*-M-M-M-*-M-M-M-'
    """
    r = recurrent_spec(recurrent_type).char
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"hybrid_attention_ratio {ratio} is outside [0, 1]")
    a = ATTENTION
    blocks = num_layers // 2
    n_attn = int(blocks * ratio)
    n_rec = blocks - n_attn
    if n_attn == 0:
        return (r + MLP) * blocks
    if ratio <= 0.5:
        return (a + MLP + (r + MLP) * (n_rec // n_attn)) * n_attn + (r + MLP) * (n_rec % n_attn)
    return (a + MLP) * (n_attn - n_rec) + (a + MLP + r + MLP) * n_rec


def validate_pattern(pattern: str) -> str:
    """Raise ValueError unless `pattern` is a well-formed sublayer string; return it."""
    bad = sorted(set(pattern) - set(MIXERS))
    if not pattern:
        raise ValueError("layer pattern is empty")
    if bad:
        raise ValueError(
            f"layer pattern {pattern!r} has unknown characters {bad} (allowed: {' '.join(MIXERS)})"
        )
    for i, c in enumerate(pattern):
        if c != MLP and (i + 1 == len(pattern) or pattern[i + 1] != MLP):
            raise ValueError(
                f"layer pattern {pattern!r}: mixer {c!r} at sublayer {i} is not followed by an MLP {MLP!r}"
            )
    return pattern


def resolve_pattern(cfg: Any) -> str:
    """The explicit `layer_pattern` if set, else the ratio algorithm over `num_hidden_layers`."""
    if getattr(cfg, "layer_pattern", None):
        return validate_pattern(cfg.layer_pattern)
    return pattern_from_ratio(cfg.num_hidden_layers, cfg.hybrid_attention_ratio, cfg.recurrent_type)


def used_mixers(pattern: str) -> list[MixerSpec]:
    """The specs of the sublayer kinds in `pattern`, in table order."""
    return [spec for char, spec in MIXERS.items() if char in pattern]


@dataclass(frozen=True)
class ParamCount:
    total: int
    embedding: int
    by_kind: dict[str, int]

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def param_count(cfg: Any) -> ParamCount:
    """Exact parameter count of `ZebraForCausalLM(cfg)` (tests compare it with `numel`)."""
    by_kind: dict[str, int] = {}
    for c in resolve_pattern(cfg):
        spec = MIXERS[c]
        by_kind[spec.name] = by_kind.get(spec.name, 0) + spec.params(cfg) + cfg.hidden_size  # + its pre-norm
    embedding = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else embedding
    total = embedding + head + sum(by_kind.values()) + cfg.hidden_size  # + final norm
    return ParamCount(total=total, embedding=embedding + head, by_kind=by_kind)


@dataclass(frozen=True)
class CacheSize:
    """Decode-cache bytes: MLA latents grow per token; recurrent and conv states are fixed per sequence."""

    per_token: int  # bytes added per generated token, all layers
    fixed_per_sequence: int  # recurrent + conv state bytes, all layers
    seq_len: int

    @property
    def per_sequence(self) -> int:
        return self.fixed_per_sequence + self.per_token * self.seq_len


def state_elems(spec: MixerSpec, cfg: Any) -> int:
    """Elements of one sequence's cache slot of a `spec` sublayer at one token: its recurrent and conv state
    (the conv state keeps the last W inputs, of which W - 1 carry over to the next token: those are counted), or
    the latents one token adds."""
    total = 0
    for name, shape in spec.state_shapes(cfg, 1, 1).items():
        if name == "conv":
            shape = (*shape[:-1], shape[-1] - 1)
        total += math.prod(shape)
    return total


def decode_cache(cfg: Any, seq_len: int, *, dtype_bytes: int = 2, state_dtype_bytes: int = 4) -> CacheSize:
    """Cache bytes for one sequence of `seq_len` tokens: latents in `dtype_bytes`, states in `state_dtype_bytes`."""
    pattern = resolve_pattern(cfg)
    per_token = sum(state_elems(MIXERS[c], cfg) for c in pattern if MIXERS[c].state == "latent")
    fixed = sum(state_elems(MIXERS[c], cfg) for c in pattern if MIXERS[c].state == "recurrent")
    return CacheSize(
        per_token=per_token * dtype_bytes, fixed_per_sequence=fixed * state_dtype_bytes, seq_len=seq_len
    )


def teacher_kv_fraction(cfg: Any, teacher_layers: int, teacher_kv_heads: int, teacher_head_dim: int) -> float:
    """Latents per token (n_MLA * (r_kv + d_rope)) / (n_layers * 2 * n_kv * head_dim): the per-token KV cache
    against a Llama teacher."""
    per_token = decode_cache(cfg, 0, dtype_bytes=1).per_token
    return per_token / (teacher_layers * 2 * teacher_kv_heads * teacher_head_dim)


def train_flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6 * N (all parameters) + causal MLA attention, 3 * H * (d_qk + d_v) * T per layer.

    The recurrent mixers' intra-chunk terms are left out (small at chunk 64), so MFU from this is a lower bound.
    """
    n = param_count(cfg).total
    n_mla = resolve_pattern(cfg).count(ATTENTION)
    d_qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    attn = 3 * cfg.num_attention_heads * (d_qk + cfg.v_head_dim) * seq_len * n_mla
    return 6.0 * n + attn


def as_config(flat: dict[str, Any]) -> SimpleNamespace:
    """Wrap a flat config dict so the functions above can read it by attribute."""
    return SimpleNamespace(**flat)
