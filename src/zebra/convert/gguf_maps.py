"""What a Zebra model is in llama.cpp's GGUF: one `GgufArch` per llama.cpp architecture, one tensor map per mixer.

A GGUF block `i` is Zebra's sublayers `2i` (its mixer) and `2i + 1` (its SwiGLU MLP), as in the native exports
(`zebra.convert.native`). Each Zebra mixer kind has a `GgufMixer` in `GGUF_MIXERS`, keyed by its registry name
(`zebra.mixers.MIXERS`): the settings llama.cpp cannot run exactly and the GGUF tensors, each built from Zebra
tensors by renaming, concatenation, row permutation or reshape, except the decay rates llama.cpp stores as
`-exp(A_log)` (computed in float64, rounded once). Each `GgufArch` holds the mixers its loader builds and writes
its metadata. Tensor names, shapes and keys are those of llama.cpp as vendored by llama-cpp-python 0.3.36
(`src/models/{qwen35,granite-hybrid,kimi-linear}.cpp`, `src/llama-arch.cpp`); GGUF lists shapes innermost
first, so a numpy `[rows, cols]` matrix is llama.cpp's `{cols, rows}`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from zebra.mixers import MIXERS
from zebra.mixers.spec import Blocker, NativeTensor

Tensors = Callable[[Any, str, str], list[NativeTensor]]
# llama.cpp 0.3.36's hybrid memory fails on its first decode when no layer is attention (GGML_ASSERT(buffer) in
# llama_kv_cache::set_input_k_idxs: the attention inputs no layer reads are never allocated). A pure GDN or Mamba2
# model therefore gets one more block, last: an attention block and MLP whose every weight is zero. It adds exactly
# 0 to the residual stream (x + 0 == x in floating point), so the logits are unchanged, bit for bit.
PASS = "pass"
L2NORM_EPS = (
    1e-6  # Zebra's q/k L2 normalisation (zebra_kernels); llama.cpp uses the model's norm epsilon there
)
MAMBA_EXPAND = 2  # granitehybrid's loader asserts d_inner == 2 * n_embd


@dataclass(frozen=True)
class GgufMixer:
    """One Zebra mixer kind in GGUF: `blockers(cfg)` and `tensors(cfg, zebra prefix, block prefix)`."""

    blockers: Callable[[Any], list[Blocker]]
    tensors: Tensors


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


def _same(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0]


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=0)


def _neg_exp(parts: list[torch.Tensor]) -> torch.Tensor:
    return -torch.exp(parts[0].double()).to(parts[0].dtype)  # llama.cpp's A = -exp(A_log)


def _column(
    build: Callable[[list[torch.Tensor]], torch.Tensor],
) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    return lambda parts: build(parts).reshape(-1, 1)  # [H] -> [H, 1]: llama.cpp's {1, H}


def _eps_blocker(cfg: Any, eps: float, why: str) -> list[Blocker]:
    return [] if cfg.rms_norm_eps == eps else [Blocker("model.norm_eps", cfg.rms_norm_eps, eps, why)]


# ---------------------------------------------------------------------------------------------- GDN (qwen35)
def _tiled(cfg: Any, width: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Value-head rows grouped by key head `[k0: v0..v(r-1) | k1: ...]` (Zebra, FLA) -> tiled `[v0 of k0, v0 of
    k1, ..., v1 of k0, ...]`, the order llama.cpp's broadcast of the H key heads over HV value heads reads."""
    H, r = cfg.gdn_num_heads, cfg.gdn_num_v_heads // cfg.gdn_num_heads

    def reorder(t: torch.Tensor) -> torch.Tensor:  # [HV * width, ...]
        return t.reshape(H, r, width, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    return reorder


def _gdn_blockers(cfg: Any) -> list[Blocker]:
    out = []
    if cfg.gdn_allow_neg_eigval:
        out.append(Blocker("model.gdn.allow_neg_eigval", True, False, "beta is sigmoid(b) in (0, 1) there"))
    if cfg.gdn_head_v_dim != cfg.gdn_head_dim:
        why = "its loader sizes value heads by the key head dim"
        out.append(Blocker("model.gdn.head_v_dim", cfg.gdn_head_v_dim, cfg.gdn_head_dim, why))
    return out + _eps_blocker(cfg, L2NORM_EPS, "its q/k L2 norm uses the model epsilon, Zebra's uses 1e-6")


def _gdn_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    V = cfg.gdn_head_v_dim
    value, head = _tiled(cfg, V), _tiled(cfg, 1)

    def qkv(
        parts: list[torch.Tensor],
    ) -> torch.Tensor:  # rows [q | k | v], v tiled; conv: [C, 1, W] -> [C, W]
        q, k, v = (p.reshape(p.shape[0], -1) for p in parts)
        return torch.cat([q, k, value(v)])

    return [
        NativeTensor(b + "attn_qkv.weight", _w(z, "q_proj", "k_proj", "v_proj"), qkv),
        NativeTensor(b + "attn_gate.weight", _w(z, "g_proj"), lambda p: value(p[0])),
        NativeTensor(b + "ssm_conv1d.weight", _w(z, "q_conv1d", "k_conv1d", "v_conv1d"), qkv),
        NativeTensor(b + "ssm_dt.bias", (z + "dt_bias",), lambda p: head(p[0])),
        NativeTensor(b + "ssm_a", (z + "A_log",), lambda p: head(_neg_exp(p))),
        NativeTensor(b + "ssm_beta.weight", _w(z, "b_proj"), lambda p: head(p[0])),
        NativeTensor(b + "ssm_alpha.weight", _w(z, "a_proj"), lambda p: head(p[0])),
        NativeTensor(b + "ssm_norm.weight", (z + "o_norm.weight",)),
        NativeTensor(b + "ssm_out.weight", _w(z, "o_proj"), lambda p: value(p[0].T).T),
    ]


def _w(prefix: str, *modules: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{m}.weight" for m in modules)


# ---------------------------------------------------------------------------------------------- Mamba2 (granitehybrid)
def _mamba2_blockers(cfg: Any) -> list[Blocker]:
    from zebra.models.layers.mamba2 import MAMBA_NORM_EPS

    out = []
    if cfg.mamba_expand != MAMBA_EXPAND:
        why = "its loader asserts an inner width of twice the model width"
        out.append(Blocker("model.mamba.expand", cfg.mamba_expand, MAMBA_EXPAND, why))
    why = "one epsilon serves every norm there, and Zebra's Mamba2 gated norm uses 1e-5"
    return out + _eps_blocker(cfg, MAMBA_NORM_EPS, why)


def _mamba2_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    G = cfg.mamba_num_groups
    return [
        NativeTensor(b + "ssm_in.weight", _w(z, "in_proj")),  # rows [z | x | B | C | dt], llama.cpp's order
        NativeTensor(b + "ssm_conv1d.weight", _w(z, "conv1d"), lambda p: p[0].squeeze(1)),  # [C, W]
        NativeTensor(b + "ssm_conv1d.bias", (z + "conv1d.bias",)),
        NativeTensor(b + "ssm_dt.bias", (z + "dt_bias",)),
        NativeTensor(b + "ssm_a", (z + "A_log",), _column(_neg_exp)),
        NativeTensor(b + "ssm_d", (z + "D",), _column(_same)),
        NativeTensor(b + "ssm_norm.weight", _w(z, "norm"), lambda p: p[0].reshape(G, -1)),  # per group
        NativeTensor(b + "ssm_out.weight", _w(z, "out_proj")),
    ]


# ---------------------------------------------------------------------------------------------- KDA, MLA (kimi-linear)
def _kda_blockers(cfg: Any) -> list[Blocker]:
    out = []
    if cfg.kda_gate_bias:
        out.append(Blocker("model.kda.gate_bias", True, False, "its output gate g_b has no bias"))
    if cfg.kda_head_dim != cfg.kda_head_v_dim:
        why = f"one kda.head_dim serves queries, keys and values (head_v_dim is {cfg.kda_head_v_dim})"
        out.append(Blocker("model.kda.head_dim", cfg.kda_head_dim, cfg.kda_head_v_dim, why))
    if "*" in cfg.layer_pattern and cfg.kda_num_heads != cfg.num_attention_heads:
        why = "one head count serves its KDA and MLA layers"
        out.append(Blocker("model.kda.num_heads", cfg.kda_num_heads, cfg.num_attention_heads, why))
    return out + _eps_blocker(cfg, L2NORM_EPS, "its q/k L2 norm uses the model epsilon, Zebra's uses 1e-6")


def _kda_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "b_proj": "ssm_beta",
             "f_proj.0": "ssm_f_a", "f_proj.1": "ssm_f_b", "g_proj.0": "ssm_g_a", "g_proj.1": "ssm_g_b",
             "o_norm": "ssm_norm", "o_proj": "attn_output"}  # fmt: skip
    convs = [NativeTensor(f"{b}ssm_conv1d_{x}.weight", _w(z, f"{x}_conv1d")) for x in "qkv"]  # [C, 1, W]
    return [
        *(NativeTensor(f"{b}{g}.weight", _w(z, m)) for m, g in names.items()),
        *convs,
        NativeTensor(b + "ssm_dt.bias", (z + "dt_bias",)),
        NativeTensor(b + "ssm_a", (z + "A_log",), _column(_neg_exp)),
    ]


def _mla_blockers(cfg: Any) -> list[Blocker]:
    out = []
    if cfg.mla_rope:
        out.append(Blocker("model.mla.rope", True, False, "its MLA has no positional encoding (NoPE)"))
    if not cfg.mla_latent_norm:
        out.append(Blocker("model.mla.latent_norm", False, True, "it normalises the key/value latent"))
    return out


def _mla_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    H, nope, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim

    def kv_up(parts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:  # per head rows [k_nope | v]
        return parts[0].reshape(H, nope + dv, -1).split([nope, dv], dim=1)  # [H, nope, R], [H, dv, R]

    if cfg.q_lora_rank:
        query = [NativeTensor(b + "attn_q_a.weight", _w(z, "q_down_proj")),
                 NativeTensor(b + "attn_q_a_norm.weight", _w(z, "q_norm")),
                 NativeTensor(b + "attn_q_b.weight", _w(z, "q_up_proj"))]  # fmt: skip
    else:
        query = [NativeTensor(b + "attn_q.weight", _w(z, "q_proj"))]
    return [
        *query,
        NativeTensor(b + "attn_kv_a_mqa.weight", _w(z, "kv_down_proj")),  # rows [latent | rope part]
        NativeTensor(b + "attn_kv_a_norm.weight", _w(z, "kv_norm")),
        NativeTensor(b + "attn_k_b.weight", _w(z, "kv_up_proj"), lambda p: kv_up(p)[0].transpose(1, 2)),
        NativeTensor(b + "attn_v_b.weight", _w(z, "kv_up_proj"), lambda p: kv_up(p)[1]),
        NativeTensor(b + "attn_output.weight", _w(z, "o_proj")),
    ]


def _mlp_tensors(cfg: Any, z: str, b: str) -> list[NativeTensor]:
    return [NativeTensor(f"{b}ffn_{p}.weight", _w(z, f"{p}_proj")) for p in ("gate", "up", "down")]


GGUF_MIXERS: dict[str, GgufMixer] = {
    "gdn": GgufMixer(_gdn_blockers, _gdn_tensors),
    "mamba2": GgufMixer(_mamba2_blockers, _mamba2_tensors),
    "kda": GgufMixer(_kda_blockers, _kda_tensors),
    "mla": GgufMixer(_mla_blockers, _mla_tensors),
    "mlp": GgufMixer(lambda cfg: [], _mlp_tensors),
}


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
    w.add_ssm_time_step_rank(cfg.gdn_num_v_heads)
    w.add_ssm_inner_size(cfg.gdn_num_v_heads * cfg.gdn_head_v_dim)
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


def blockers(cfg: Any) -> list[Blocker]:
    """What stops an exact GGUF of the model (its mixers' settings)."""
    return [b for kind in dict.fromkeys(layer_kinds(cfg)) for b in GGUF_MIXERS[kind].blockers(cfg)]


def plan(cfg: Any, arch: GgufArch, zebra_names: list[str]) -> list[NativeTensor]:
    """Every GGUF tensor, in block order, from the Zebra tensor names `zebra_names`."""
    out = [NativeTensor("token_embd.weight", ("model.embeddings.weight",))]
    for i, kind in enumerate(layer_kinds(cfg)):
        mixer, mlp, block = f"model.layers.{2 * i}.", f"model.layers.{2 * i + 1}.", f"blk.{i}."
        out.append(NativeTensor(block + "attn_norm.weight", (mixer + "norm.weight",)))
        out += GGUF_MIXERS[kind].tensors(cfg, mixer + "mixer.", block)
        out.append(NativeTensor(f"{block}{arch.post_norm}.weight", (mlp + "norm.weight",)))
        out += GGUF_MIXERS["mlp"].tensors(cfg, mlp + "mixer.", block)
    out.append(NativeTensor("output_norm.weight", ("model.norm.weight",)))
    if "lm_head.weight" in zebra_names and not cfg.tie_word_embeddings:
        out.append(NativeTensor("output.weight", ("lm_head.weight",)))
    elif arch.writes_output:
        out.append(NativeTensor("output.weight", ("model.embeddings.weight",)))
    return out
