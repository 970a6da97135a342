"""Architecture arithmetic with no torch: layer patterns, parameter counts, decode-cache sizes, FLOPs.

Everything here reads a *flat* model configuration: any object with the attribute names of
`zebra.models.ZebraConfig` (the config itself, or `Recipe.model.flat()` wrapped in a namespace). It is imported
by `zebra recipes list` and must stay instant, so it imports nothing heavy.

Pattern alphabet (one character per sublayer, Megatron numbering):
    M  Mamba2 mixer          G  Gated DeltaNet mixer       K  Kimi Delta Attention mixer
    *  Multi-Latent Attention   -  SwiGLU MLP
Each sublayer is pre-norm residual: x = x + f(norm(x)).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

SUBLAYER_KINDS = {"M": "mamba2", "G": "gdn", "K": "kda", "*": "mla", "-": "mlp"}
RECURRENT_CHARS = {"mamba2": "M", "gdn": "G", "kda": "K"}


def pattern_from_ratio(num_layers: int, ratio: float, recurrent: str) -> str:
    """The sublayer pattern Primus derives from `hybrid_attention_ratio` (reference.md section 1).

    >>> pattern_from_ratio(32, 0.25, "mamba2")
    '*-M-M-M-*-M-M-M-*-M-M-M-*-M-M-M-'
    """
    if recurrent not in RECURRENT_CHARS:
        raise ValueError(f"recurrent type {recurrent!r} is not one of {sorted(RECURRENT_CHARS)}")
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"hybrid_attention_ratio {ratio} is outside [0, 1]")
    r = RECURRENT_CHARS[recurrent]
    blocks = num_layers // 2
    n_attn = int(blocks * ratio)
    n_rec = blocks - n_attn
    if n_attn == 0:
        return (r + "-") * blocks
    if ratio <= 0.5:
        return ("*-" + (r + "-") * (n_rec // n_attn)) * n_attn + (r + "-") * (n_rec % n_attn)
    return "*-" * (n_attn - n_rec) + ("*-" + r + "-") * n_rec


def validate_pattern(pattern: str) -> str:
    """Raise ValueError unless `pattern` is a well-formed sublayer string; return it."""
    bad = sorted(set(pattern) - set(SUBLAYER_KINDS))
    if not pattern:
        raise ValueError("layer pattern is empty")
    if bad:
        raise ValueError(f"layer pattern {pattern!r} has unknown characters {bad} (allowed: M G K * -)")
    for i, c in enumerate(pattern):
        if c != "-" and (i + 1 == len(pattern) or pattern[i + 1] != "-"):
            raise ValueError(
                f"layer pattern {pattern!r}: mixer {c!r} at sublayer {i} is not followed by an MLP '-'"
            )
    return pattern


def resolve_pattern(cfg: Any) -> str:
    """The explicit `layer_pattern` if set, else the ratio algorithm over `num_hidden_layers`."""
    if getattr(cfg, "layer_pattern", None):
        return validate_pattern(cfg.layer_pattern)
    return pattern_from_ratio(cfg.num_hidden_layers, cfg.hybrid_attention_ratio, cfg.recurrent_type)


def mamba_num_heads(cfg: Any) -> int:
    return cfg.mamba_expand * cfg.hidden_size // cfg.mamba_head_dim


def sublayer_params(kind: str, cfg: Any) -> int:
    """Parameters of one sublayer of `kind` ('mamba2', 'gdn', 'kda', 'mla', 'mlp'), its pre-norm included."""
    d = cfg.hidden_size
    if kind == "mlp":
        n = 3 * d * cfg.intermediate_size
    elif kind == "mla":
        h = cfg.num_attention_heads
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            q = d * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * h * qk
        else:
            q = d * h * qk
        kv = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank
        kv += cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        n = q + kv + h * cfg.v_head_dim * d
    elif kind == "gdn":
        key = cfg.gdn_num_heads * cfg.gdn_head_dim
        val = cfg.gdn_num_v_heads * cfg.gdn_head_v_dim
        hv = cfg.gdn_num_v_heads
        n = d * (2 * key + 2 * val + 2 * hv)  # q, k, v, g (gate), a, b projections
        n += val * d  # o_proj
        n += (2 * key + val) * cfg.gdn_conv_size  # depthwise convs, no bias
        n += 2 * hv + cfg.gdn_head_v_dim  # A_log, dt_bias, o_norm
    elif kind == "kda":
        h, dk, dv = cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_head_v_dim
        key, val = h * dk, h * dv
        n = d * (2 * key + val)  # q, k, v
        n += d * dv + dv * key  # f_proj: D -> dv -> H*K (decay)
        n += d * h  # b_proj (beta)
        n += d * dv + dv * val + val  # g_proj: D -> dv -> H*V with bias (output gate)
        n += val * d  # o_proj
        n += (2 * key + val) * cfg.kda_conv_size
        n += h + key + dv  # A_log [H], dt_bias [H*K], o_norm [V]
    elif kind == "mamba2":
        d_inner = cfg.mamba_expand * d
        heads = mamba_num_heads(cfg)
        gn = cfg.mamba_num_groups * cfg.mamba_state_dim
        n = d * (2 * d_inner + 2 * gn + heads)  # in_proj -> [z | x | B | C | dt]
        n += (d_inner + 2 * gn) * (cfg.mamba_conv_size + 1)  # conv1d weight + bias over xBC
        n += 3 * heads  # A_log, D, dt_bias
        n += d_inner  # gated RMSNorm
        n += d_inner * d  # out_proj
    else:
        raise ValueError(f"unknown sublayer kind {kind!r}")
    return n + d  # the sublayer's pre-norm


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
    pattern = resolve_pattern(cfg)
    by_kind: dict[str, int] = {}
    for c in pattern:
        kind = SUBLAYER_KINDS[c]
        by_kind[kind] = by_kind.get(kind, 0) + sublayer_params(kind, cfg)
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


def recurrent_state_elems(kind: str, cfg: Any) -> int:
    """Elements of one sequence's recurrent state plus conv state for one mixer sublayer."""
    if kind == "gdn":
        key, val = cfg.gdn_num_heads * cfg.gdn_head_dim, cfg.gdn_num_v_heads * cfg.gdn_head_v_dim
        return cfg.gdn_num_v_heads * cfg.gdn_head_dim * cfg.gdn_head_v_dim + (2 * key + val) * (
            cfg.gdn_conv_size - 1
        )
    if kind == "kda":
        h, dk, dv = cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_head_v_dim
        return h * dk * dv + (2 * h * dk + h * dv) * (cfg.kda_conv_size - 1)
    if kind == "mamba2":
        heads = mamba_num_heads(cfg)
        conv_ch = cfg.mamba_expand * cfg.hidden_size + 2 * cfg.mamba_num_groups * cfg.mamba_state_dim
        return heads * cfg.mamba_head_dim * cfg.mamba_state_dim + conv_ch * (cfg.mamba_conv_size - 1)
    return 0


def decode_cache(cfg: Any, seq_len: int, *, dtype_bytes: int = 2, state_dtype_bytes: int = 4) -> CacheSize:
    """Cache bytes for one sequence of `seq_len` tokens: latents in `dtype_bytes`, states in `state_dtype_bytes`."""
    pattern = resolve_pattern(cfg)
    n_mla = pattern.count("*")
    per_token = n_mla * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * dtype_bytes
    fixed = sum(recurrent_state_elems(SUBLAYER_KINDS[c], cfg) for c in pattern) * state_dtype_bytes
    return CacheSize(per_token=per_token, fixed_per_sequence=fixed, seq_len=seq_len)


def teacher_kv_fraction(cfg: Any, teacher_layers: int, teacher_kv_heads: int, teacher_head_dim: int) -> float:
    """n_MLA * (r_kv + d_rope) / (n_layers * 2 * n_kv * head_dim): the per-token KV cache against a Llama teacher."""
    n_mla = resolve_pattern(cfg).count("*")
    return (
        n_mla
        * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        / (teacher_layers * 2 * teacher_kv_heads * teacher_head_dim)
    )


def train_flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6 * N (all parameters) + causal MLA attention, 3 * H * (d_qk + d_v) * T per layer.

    The recurrent mixers' intra-chunk terms are left out (small at chunk 64), so MFU from this is a lower bound.
    """
    n = param_count(cfg).total
    n_mla = resolve_pattern(cfg).count("*")
    d_qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    attn = 3 * cfg.num_attention_heads * (d_qk + cfg.v_head_dim) * seq_len * n_mla
    return 6.0 * n + attn


def as_config(flat: dict[str, Any]) -> SimpleNamespace:
    """Wrap a flat config dict so the functions above can read it by attribute."""
    return SimpleNamespace(**flat)
