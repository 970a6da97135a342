"""Multi-Latent Attention, the `*` sublayer (`zebra.models.layers.mla`); its `ZebraConfig` keys are plain HF names
(`num_attention_heads`, `q_lora_rank`, ...; the YaRN pair is `rope_scaling`), its recipe section `model.mla`."""

from __future__ import annotations

from typing import Any

from zebra.mixers.spec import (
    ATTENTION,
    HEAD_DIM,
    HEADS,
    MEGATRON_LAYER,
    POSITIONS,
    RANK,
    ZEBRA_LAYER,
    Blocker,
    ConfigField,
    GgufAdapter,
    MegatronAdapter,
    MixerSpec,
    NativeAdapter,
    NativeTensor,
    register_mixer,
    weights,
)

# Kimi-Linear's KimiLinearAttention builds its latent RMSNorms with the default epsilon
KIMI_LATENT_NORM_EPS = 1e-6

# Where a Megatron MLA layer keeps its key/value latent norm (its own module, or fused into linear_kv_up_proj);
# a checkpoint with neither was built with `q_layernorm/kv_layernorm = IdentityOp` (no latent norms).
_KV_LATENT_NORMS = (
    "self_attention.kv_layernorm.weight",
    "self_attention.linear_kv_up_proj.layer_norm_weight",
)


_SA, _ZM = MEGATRON_LAYER + "self_attention.", ZEBRA_LAYER + "mixer."
# megatron-core's MultiLatentAttention (transformer/multi_latent_attention.py): each latent norm TE-fused into
# its up projection or its own module (q_layernorm / kv_layernorm), both accepted.
_MEGATRON_KEYS = {
    MEGATRON_LAYER + "input_layernorm.weight": ZEBRA_LAYER + "norm.weight",
    _SA + "linear_q_proj.weight": _ZM + "q_proj.weight",
    _SA + "linear_q_down_proj.weight": _ZM + "q_down_proj.weight",
    _SA + "linear_q_up_proj.layer_norm_weight": _ZM + "q_norm.weight",
    _SA + "q_layernorm.weight": _ZM + "q_norm.weight",
    _SA + "linear_q_up_proj.weight": _ZM + "q_up_proj.weight",
    _SA + "linear_kv_down_proj.weight": _ZM + "kv_down_proj.weight",
    _SA + "linear_kv_up_proj.layer_norm_weight": _ZM + "kv_norm.weight",
    _SA + "kv_layernorm.weight": _ZM + "kv_norm.weight",
    _SA + "linear_kv_up_proj.weight": _ZM + "kv_up_proj.weight",
    _SA + "linear_proj.weight": _ZM + "o_proj.weight",
}


def _params(cfg: Any) -> int:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    norms = bool(getattr(cfg, "mla_latent_norm", True))  # the latent RMSNorms' weights
    if cfg.q_lora_rank:
        q = d * cfg.q_lora_rank + norms * cfg.q_lora_rank + cfg.q_lora_rank * h * qk
    else:
        q = d * h * qk
    kv = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + norms * cfg.kv_lora_rank
    kv += cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return q + kv + h * cfg.v_head_dim * d


def _check(cfg: Any) -> list[tuple[str, str]]:
    if cfg.qk_rope_head_dim % 2:
        return [("qk_rope_head_dim", f"{cfg.qk_rope_head_dim} is odd (expected an even count for RoPE)")]
    return []


def _megatron_fields(arg, first) -> dict[str, Any]:
    q_lora = arg("q_lora_rank", 0)
    max_pos = int(arg("max_position_embeddings", 0) or arg("seq_length"))
    return {
        "num_attention_heads": int(arg("num_attention_heads")),
        "q_lora_rank": int(q_lora) if q_lora else 0,
        "kv_lora_rank": int(arg("kv_lora_rank")),
        "qk_nope_head_dim": int(arg("qk_head_dim")),
        "qk_rope_head_dim": int(arg("qk_pos_emb_head_dim")),
        "v_head_dim": int(arg("v_head_dim")),
        "rope_theta": float(arg("rotary_base", 10000)),
        "rope_scaling": {
            "type": "yarn",
            "factor": float(arg("rotary_scaling_factor", 1.0)),
            "original_max_position_embeddings": int(arg("original_max_position_embeddings", 0) or max_pos),
        },
        "mla_latent_norm": any(first(name) is not None for name in _KV_LATENT_NORMS),  # IdentityOp: no tensor
    }


def _gguf_blockers(cfg: Any) -> list[Blocker]:
    """Kimi-Linear's MLA, in llama.cpp as in transformers: NoPE, the key/value latent normalised."""
    out = []
    if cfg.mla_rope:
        out.append(Blocker("model.mla.rope", True, False, "its MLA has no positional encoding (NoPE)"))
    if not cfg.mla_latent_norm:
        out.append(Blocker("model.mla.latent_norm", False, True, "it normalises the key/value latent"))
    return out


def _native_blockers(cfg: Any) -> list[Blocker]:
    """Kimi-Linear's MLA in transformers: as in llama.cpp, and its latent norms with epsilon 1e-6."""
    out = _gguf_blockers(cfg)
    if cfg.rms_norm_eps != KIMI_LATENT_NORM_EPS:
        out.append(
            Blocker("model.norm_eps", cfg.rms_norm_eps, KIMI_LATENT_NORM_EPS, "its MLA latent norms use 1e-6")
        )
    return out


def _native_tensors(cfg: Any, z: str, n: str, to: str) -> list[NativeTensor]:
    """Kimi-Linear's KimiMLAAttention."""
    if cfg.q_lora_rank:
        query = [
            NativeTensor(n + "q_a_proj.weight", (z + "q_down_proj.weight",)),
            NativeTensor(n + "q_a_layernorm.weight", (z + "q_norm.weight",)),
            NativeTensor(n + "q_b_proj.weight", (z + "q_up_proj.weight",)),
        ]
    else:
        query = [NativeTensor(n + "q_proj.weight", (z + "q_proj.weight",))]
    return [
        *query,
        NativeTensor(n + "kv_a_proj_with_mqa.weight", (z + "kv_down_proj.weight",)),
        NativeTensor(n + "kv_a_layernorm.weight", (z + "kv_norm.weight",)),
        NativeTensor(n + "kv_b_proj.weight", (z + "kv_up_proj.weight",)),
        NativeTensor(n + "o_proj.weight", (z + "o_proj.weight",)),
    ]


def _gguf_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    """llama.cpp's kimi-linear MLA block: MQA over the latent, the key/value up projection split per head."""
    H, nope, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim

    def kv_up(parts: list[Any]) -> tuple[Any, Any]:  # per head rows [k_nope | v]
        return parts[0].reshape(H, nope + dv, -1).split([nope, dv], dim=1)  # [H, nope, R], [H, dv, R]

    if cfg.q_lora_rank:
        query = [NativeTensor(b + "attn_q_a.weight", weights(z, "q_down_proj")),
                 NativeTensor(b + "attn_q_a_norm.weight", weights(z, "q_norm")),
                 NativeTensor(b + "attn_q_b.weight", weights(z, "q_up_proj"))]  # fmt: skip
    else:
        query = [NativeTensor(b + "attn_q.weight", weights(z, "q_proj"))]
    return [
        *query,
        NativeTensor(b + "attn_kv_a_mqa.weight", weights(z, "kv_down_proj")),  # rows [latent | rope part]
        NativeTensor(b + "attn_kv_a_norm.weight", weights(z, "kv_norm")),
        NativeTensor(b + "attn_k_b.weight", weights(z, "kv_up_proj"), lambda p: kv_up(p)[0].transpose(1, 2)),
        NativeTensor(b + "attn_v_b.weight", weights(z, "kv_up_proj"), lambda p: kv_up(p)[1]),
        NativeTensor(b + "attn_output.weight", weights(z, "o_proj")),
    ]


def _native_config(cfg: Any) -> dict[str, Any]:
    return {
        "mla_use_nope": True,  # Moonshot's flag; vLLM's KimiMLAAttention asserts it (transformers is NoPE always)
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "q_lora_rank": cfg.q_lora_rank or None,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
    }


MLA = register_mixer(
    MixerSpec(
        char=ATTENTION,
        name="mla",
        label="MLA",
        title="MLA",
        layer="zebra.models.layers.mla.MultiLatentAttention",
        params=_params,
        state="latent",
        state_shapes=lambda c, batch_size, max_length: {
            "latent": (batch_size, max_length, c.kv_lora_rank),
            "k_rope": (batch_size, max_length, c.qk_rope_head_dim),
        },
        fields=(
            ConfigField("num_heads", 32, "attention heads", 1, HEADS, key="num_attention_heads"),
            ConfigField("q_lora_rank", 1344, "query latent rank (0 = no query compression)", 0, RANK),
            ConfigField("kv_lora_rank", 128, "key/value latent rank: the cached latent per token", 1, RANK),
            ConfigField("qk_nope_head_dim", 32, "per-head query/key channels without RoPE", 0, HEAD_DIM),
            ConfigField(
                "qk_rope_head_dim",
                32,
                "per-head query/key channels with RoPE (key part shared and cached)",
                2,
                HEAD_DIM,
            ),
            ConfigField("v_head_dim", 64, "per-head value channels", 1, HEAD_DIM),
            ConfigField(
                "latent_norm",
                True,
                "RMSNorm on the query and key/value latents (false: none, as the published upcycled students)",
                key="mla_latent_norm",
            ),
            ConfigField(
                "rope",
                True,
                "rotate the qk_rope_head_dim channels by position (false: NoPE, the shared key part unrotated, "
                "Kimi-Linear's form)",
                key="mla_rope",
            ),
            ConfigField("rope_theta", 500000.0, "RoPE base", 1.0, 1e12),
            ConfigField(
                "rope_scaling_factor",
                1.0,
                "YaRN scaling factor (1.0 = plain RoPE)",
                1.0,
                1024.0,
                key="rope_scaling.factor",
            ),
            ConfigField(
                "original_max_position_embeddings",
                8192,
                "YaRN: the context the base model was trained at",
                1,
                POSITIONS,
                key="rope_scaling.original_max_position_embeddings",
            ),
        ),
        section="mla",
        section_doc="Multi-Latent Attention dimensions",
        check=_check,
        summary=lambda c: (
            f"{c.num_attention_heads} heads, q rank {c.q_lora_rank}, kv rank {c.kv_lora_rank}, nope/rope/v "
            f"{c.qk_nope_head_dim}/{c.qk_rope_head_dim}/{c.v_head_dim}, "
            + (
                f"RoPE theta {c.rope_theta}"
                if getattr(c, "mla_rope", True)
                else "no positional encoding (NoPE)"
            )
            + ("" if getattr(c, "mla_latent_norm", True) else ", no latent norms")
        ),
        megatron=MegatronAdapter(
            detect=lambda names: any(n.startswith("self_attention.") for n in names),
            fields=_megatron_fields,
            keys=_MEGATRON_KEYS,
            pre_norms=("input_layernorm.weight",),
        ),
        native=NativeAdapter(
            tensors=_native_tensors,
            blockers=_native_blockers,
            config=_native_config,
            servable="1b-kda-mla-kimi (KDA + NoPE MLA, --to kimi-linear)",
        ),
        gguf=GgufAdapter(tensors=_gguf_tensors, blockers=_gguf_blockers),
    )
)
