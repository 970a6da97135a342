"""Exports to transformers' own classes: Qwen3-Next / Qwen3.5 (GDN), Bamba (Mamba2), Kimi-Linear (KDA + NoPE MLA).

A native layer `i` is the Zebra sublayers `2i` (its mixer) and `2i + 1` (its SwiGLU MLP): the pattern must
alternate mixer and MLP. Each Zebra mixer kind has one `MixerAdapter` in `ADAPTERS`, keyed by its registry name
(`zebra.mixers.MIXERS`): the settings that block an exact export (a recipe field and the value that fits) and the
native tensors, each built from Zebra tensors by concatenation, row permutation or reshape alone. Each
`NativeTarget` says which native module holds which mixer kind, how its norms store their weight (Qwen's
zero-centred `1 + w`) and its `config.json`. Nothing is computed approximately: a model that cannot be written
exactly is refused before anything is read or written (`refusal`).

Names, permutations and norms are those of transformers 5.25's `modeling_{qwen3_next,qwen3_5,bamba,kimi_linear}.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from zebra.errors import ZebraError
from zebra.mixers import MIXERS, MLP

Build = Callable[[list[torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class NativeTensor:
    """One tensor of the native checkpoint: `name`, the Zebra tensors it is made of, and how."""

    name: str
    sources: tuple[str, ...]
    build: Build = staticmethod(lambda parts: parts[0])  # type: ignore[assignment]


@dataclass(frozen=True)
class Blocker:
    """A setting with no exact native equivalent: the recipe field, its value, and the value that fits."""

    field: str
    value: Any
    fits: Any
    why: str


@dataclass(frozen=True)
class MixerAdapter:
    """How one Zebra mixer kind becomes a native layer's mixer.

    Attributes:
        mixer: its registry name (`zebra.mixers.MixerSpec.name`).
        blockers: `(config, target) -> [Blocker]`: what stops an exact export.
        tensors: `(config, zebra prefix, native prefix, target) -> [NativeTensor]`; the prefixes end in a dot.
    """

    mixer: str
    blockers: Callable[[Any, NativeTarget], list[Blocker]]
    tensors: Callable[[Any, str, str, NativeTarget], list[NativeTensor]]


@dataclass(frozen=True)
class NativeTarget:
    """One transformers class an export can target (`zebra convert --to NAME`).

    Attributes:
        name: the `--to` value.
        architecture: the class (`config.json` `architectures`).
        mixers: Zebra mixer name -> (native `layer_types` entry, module attribute of the decoder layer).
        mlp: the decoder layer's MLP attribute; `post_norm` its pre-MLP norm; `final_norm` the model's last norm.
        zero_centred_norms: the layer norms compute `x * (1 + w)` (Qwen): their weight is written as `w - 1`.
        config: `(zebra config, layer_types) -> config.json fields` (without ids, dtype, architectures).
        fused_gdn: Qwen3-Next's interleaved `in_proj_qkvz` / `in_proj_ba` (else Qwen3.5's separate projections).
    """

    name: str
    architecture: str
    mixers: dict[str, tuple[str, str]]
    mlp: str
    post_norm: str
    final_norm: str
    zero_centred_norms: bool
    config: Callable[[Any, list[str]], dict[str, Any]]
    fused_gdn: bool = False


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=0)


def _minus_one(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] - 1  # Qwen's RMSNorm multiplies by (1 + w)


# ---------------------------------------------------------------------------------------------- GDN
def _gdn_blockers(cfg: Any, target: NativeTarget) -> list[Blocker]:
    if cfg.gdn_allow_neg_eigval:
        return [Blocker("model.gdn.allow_neg_eigval", True, False, "beta is sigmoid(b) in (0, 1) there")]
    return []


def _qwen3_next_qkvz(cfg: Any) -> Build:
    """`[q | k | v | g]` (Zebra, each by head) -> per key head `[q_h | k_h | v_h.. | z_h..]` (Qwen3-Next)."""
    H, K, V, r = (
        cfg.gdn_num_heads,
        cfg.gdn_head_dim,
        cfg.gdn_head_v_dim,
        cfg.gdn_num_v_heads // cfg.gdn_num_heads,
    )

    def build(parts: list[torch.Tensor]) -> torch.Tensor:
        q, k, v, z = parts  # [H*K, D], [H*K, D], [HV*V, D], [HV*V, D]
        D = q.shape[-1]
        grouped = [q.view(H, K, D), k.view(H, K, D), v.view(H, r * V, D), z.view(H, r * V, D)]
        return torch.cat(grouped, dim=1).reshape(-1, D)  # [H * (2K + 2rV), D]

    return build


def _qwen3_next_ba(cfg: Any) -> Build:
    H, r = cfg.gdn_num_heads, cfg.gdn_num_v_heads // cfg.gdn_num_heads

    def build(parts: list[torch.Tensor]) -> torch.Tensor:
        b, a = parts  # [HV, D] each
        D = b.shape[-1]
        return torch.cat([b.view(H, r, D), a.view(H, r, D)], dim=1).reshape(-1, D)  # [H * 2r, D]

    return build


def _gdn_tensors(cfg: Any, z: str, n: str, target: NativeTarget) -> list[NativeTensor]:
    if target.fused_gdn:
        projections = [
            NativeTensor(n + "in_proj_qkvz.weight", _w(z, "q_proj", "k_proj", "v_proj", "g_proj"), _qwen3_next_qkvz(cfg)),
            NativeTensor(n + "in_proj_ba.weight", _w(z, "b_proj", "a_proj"), _qwen3_next_ba(cfg)),
        ]  # fmt: skip
    else:
        projections = [
            NativeTensor(n + "in_proj_qkv.weight", _w(z, "q_proj", "k_proj", "v_proj"), _cat),
            NativeTensor(n + "in_proj_z.weight", _w(z, "g_proj")),
            NativeTensor(n + "in_proj_b.weight", _w(z, "b_proj")),
            NativeTensor(n + "in_proj_a.weight", _w(z, "a_proj")),
        ]
    return [
        *projections,
        NativeTensor(n + "conv1d.weight", _w(z, "q_conv1d", "k_conv1d", "v_conv1d"), _cat),
        NativeTensor(n + "A_log", (z + "A_log",)),
        NativeTensor(n + "dt_bias", (z + "dt_bias",)),
        NativeTensor(n + "norm.weight", (z + "o_norm.weight",)),
        NativeTensor(n + "out_proj.weight", (z + "o_proj.weight",)),
    ]


def _w(prefix: str, *modules: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{m}.weight" for m in modules)


# ---------------------------------------------------------------------------------------------- KDA
def _kda_blockers(cfg: Any, target: NativeTarget) -> list[Blocker]:
    out = []
    if cfg.kda_gate_bias:
        out.append(Blocker("model.kda.gate_bias", True, False, "its output gate g_b_proj has no bias"))
    if cfg.kda_head_dim != cfg.kda_head_v_dim:
        out.append(
            Blocker(
                "model.kda.head_dim",
                cfg.kda_head_dim,
                cfg.kda_head_v_dim,
                f"one head_dim serves queries, keys and values (head_v_dim is {cfg.kda_head_v_dim})",
            )
        )
    return out


def _kda_tensors(cfg: Any, z: str, n: str, target: NativeTarget) -> list[NativeTensor]:
    H = cfg.kda_num_heads
    return [
        *(NativeTensor(n + f"{p}.weight", (z + f"{p}.weight",)) for p in ("q_proj", "k_proj", "v_proj", "b_proj")),
        NativeTensor(n + "conv1d.weight", _w(z, "q_conv1d", "k_conv1d", "v_conv1d"), _cat),
        NativeTensor(n + "forget_gate.f_a_proj.weight", (z + "f_proj.0.weight",)),
        NativeTensor(n + "forget_gate.f_b_proj.weight", (z + "f_proj.1.weight",)),
        NativeTensor(n + "forget_gate.dt_bias", (z + "dt_bias",)),
        NativeTensor(n + "forget_gate.A_log", (z + "A_log",), lambda p: p[0].view(1, 1, H, 1)),
        NativeTensor(n + "g_a_proj.weight", (z + "g_proj.0.weight",)),
        NativeTensor(n + "g_b_proj.weight", (z + "g_proj.1.weight",)),
        NativeTensor(n + "o_norm.weight", (z + "o_norm.weight",)),
        NativeTensor(n + "o_proj.weight", (z + "o_proj.weight",)),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------- MLA
KIMI_LATENT_NORM_EPS = 1e-6  # KimiLinearAttention builds its latent RMSNorms with the default epsilon


def _mla_blockers(cfg: Any, target: NativeTarget) -> list[Blocker]:
    out = []
    if cfg.mla_rope:
        out.append(Blocker("model.mla.rope", True, False, "its MLA has no positional encoding (NoPE)"))
    if not cfg.mla_latent_norm:
        out.append(Blocker("model.mla.latent_norm", False, True, "it normalises the key/value latent"))
    if cfg.rms_norm_eps != KIMI_LATENT_NORM_EPS:
        out.append(
            Blocker("model.norm_eps", cfg.rms_norm_eps, KIMI_LATENT_NORM_EPS, "its MLA latent norms use 1e-6")
        )
    return out


def _mla_tensors(cfg: Any, z: str, n: str, target: NativeTarget) -> list[NativeTensor]:
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


# ---------------------------------------------------------------------------------------------- Mamba2
MAMBA2_PARAMS = ("in_proj.weight", "conv1d.weight", "conv1d.bias", "A_log", "D", "dt_bias", "norm.weight")


def _mamba2_tensors(cfg: Any, z: str, n: str, target: NativeTarget) -> list[NativeTensor]:
    names = (*MAMBA2_PARAMS, "out_proj.weight")
    return [NativeTensor(n + p, (z + p,)) for p in names]  # Bamba keeps Megatron's names and layouts


def _mamba2_blockers(cfg: Any, target: NativeTarget) -> list[Blocker]:
    from zebra.models.layers.mamba2 import MAMBA_NORM_EPS

    if cfg.rms_norm_eps != MAMBA_NORM_EPS:
        why = "one epsilon serves every norm there, and Zebra's Mamba2 gated norm uses 1e-5"
        return [Blocker("model.norm_eps", cfg.rms_norm_eps, MAMBA_NORM_EPS, why)]
    return []


# ---------------------------------------------------------------------------------------------- SwiGLU MLP
def _mlp_tensors(cfg: Any, z: str, n: str, target: NativeTarget) -> list[NativeTensor]:
    return [
        NativeTensor(f"{n}{p}.weight", (f"{z}{p}.weight",)) for p in ("gate_proj", "up_proj", "down_proj")
    ]


ADAPTERS: dict[str, MixerAdapter] = {
    a.mixer: a
    for a in (
        MixerAdapter("mlp", lambda cfg, target: [], _mlp_tensors),
        MixerAdapter("gdn", _gdn_blockers, _gdn_tensors),
        MixerAdapter("kda", _kda_blockers, _kda_tensors),
        MixerAdapter("mla", _mla_blockers, _mla_tensors),
        MixerAdapter("mamba2", _mamba2_blockers, _mamba2_tensors),
    )
}


# ---------------------------------------------------------------------------------------------- targets
def _common_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": len(layer_types),
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "use_cache": True,
    }


def _qwen_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    """Qwen3-Next / Qwen3.5 text: GDN layers with dense MLPs (no experts)."""
    return {
        **_common_config(cfg, layer_types),
        "layer_types": layer_types,
        "linear_num_key_heads": cfg.gdn_num_heads,
        "linear_num_value_heads": cfg.gdn_num_v_heads,
        "linear_key_head_dim": cfg.gdn_head_dim,
        "linear_value_head_dim": cfg.gdn_head_v_dim,
        "linear_conv_kernel_dim": cfg.gdn_conv_size,
    }


def _qwen3_next_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    n = len(layer_types)
    return {**_qwen_config(cfg, layer_types), "num_experts": 0, "mlp_only_layers": list(range(n))}


def _bamba_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    return {
        **_common_config(cfg, layer_types),
        "attn_layer_indices": [],
        "mamba_n_heads": cfg.mamba_expand * cfg.hidden_size // cfg.mamba_head_dim,
        "mamba_d_head": cfg.mamba_head_dim,
        "mamba_n_groups": cfg.mamba_num_groups,
        "mamba_d_state": cfg.mamba_state_dim,
        "mamba_d_conv": cfg.mamba_conv_size,
        "mamba_expand": cfg.mamba_expand,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
    }


def _kimi_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    """Kimi-Linear with dense MLPs only; `linear_attn_config` is Moonshot's own form (1-indexed layers), which
    vLLM and SGLang read, next to transformers' `layer_types`."""
    n = len(layer_types)
    kda = [i + 1 for i, t in enumerate(layer_types) if t == "linear_attention"]
    return {
        **_common_config(cfg, layer_types),
        "tie_word_embeddings": False,  # KimiLinearForCausalLM never ties lm_head: it is written
        "layer_types": layer_types,
        "mlp_layer_types": ["dense"] * n,
        "first_k_dense_replace": n,  # vLLM: a dense KimiMLP below this layer index, so everywhere
        "mla_use_nope": True,  # Moonshot's flag; vLLM's KimiMLAAttention asserts it (transformers is NoPE always)
        "linear_head_dim": cfg.kda_head_dim,
        "linear_num_heads": cfg.kda_num_heads,
        "linear_conv_kernel_dim": cfg.kda_conv_size,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": [i + 1 for i in range(n) if i + 1 not in kda],
            "head_dim": cfg.kda_head_dim,
            "num_heads": cfg.kda_num_heads,
            "short_conv_kernel_size": cfg.kda_conv_size,
        },
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "q_lora_rank": cfg.q_lora_rank or None,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
    }


_QWEN = {
    "mixers": {"gdn": ("linear_attention", "linear_attn")},
    "mlp": "mlp",
    "post_norm": "post_attention_layernorm",
}
TARGETS: dict[str, NativeTarget] = {
    t.name: t
    for t in (
        NativeTarget("qwen3-next", "Qwen3NextForCausalLM", **_QWEN, final_norm="model.norm",
                     zero_centred_norms=True, config=_qwen3_next_config, fused_gdn=True),
        NativeTarget("qwen3.5", "Qwen3_5ForCausalLM", **_QWEN, final_norm="model.norm",
                     zero_centred_norms=True, config=_qwen_config),
        NativeTarget("bamba", "BambaForCausalLM", {"mamba2": ("linear_attention", "mamba")}, "feed_forward",
                     "pre_ff_layernorm", "model.final_layernorm", False, _bamba_config),
        NativeTarget("kimi-linear", "KimiLinearForCausalLM",
                     {"kda": ("linear_attention", "self_attn"), "mla": ("full_attention", "self_attn")}, "mlp",
                     "post_attention_layernorm", "model.norm", False, _kimi_config),
    )
}  # fmt: skip
MODEL_TYPES = {
    "qwen3-next": "qwen3_next",
    "qwen3.5": "qwen3_5_text",
    "bamba": "bamba",
    "kimi-linear": "kimi_linear",
}
# where no class holds a model's mix of mixers: the recipes that export, closest first for each kind it holds
SERVABLE = {
    "mamba2": "tiny-mamba's pure Mamba2 form (--to bamba)",
    "gdn": "1b-gdn-pure (--to qwen3-next / qwen3.5)",
    "kda": "1b-kda-mla-kimi (KDA + NoPE MLA, --to kimi-linear)",
    "mla": "1b-kda-mla-kimi (KDA + NoPE MLA, --to kimi-linear)",
}


def _servable(kinds: set[str]) -> str:
    return ", or ".join(dict.fromkeys(SERVABLE[k] for k in SERVABLE if k in kinds))


def _target_for(mixers: set[str]) -> str | None:
    """The --to that holds every mixer kind in `mixers`, if any."""
    return next((t.name for t in TARGETS.values() if mixers <= set(t.mixers)), None)


def refusal(cfg: Any, to: str) -> ZebraError | None:
    """Why the model of `cfg` cannot be written exactly as `--to to` (the first reason), or None.

    Called before anything is read: every reason names the recipe field and the value that would fit.
    """
    target = TARGETS[to]
    pattern = cfg.layer_pattern
    mixers = pattern[0::2]
    if len(pattern) % 2 or set(pattern[1::2]) != {MLP} or MLP in mixers:
        return ZebraError(
            f"--to {to}: model.pattern {pattern!r} does not alternate mixer and MLP; {target.architecture}'s "
            "layers are a mixer followed by an MLP",
            fix=f"train a pattern of mixer/MLP pairs such as {'G-' * 2!r}",
        )
    kinds = {MIXERS[c].name for c in mixers}
    labels = " + ".join(MIXERS[c].label for c in dict.fromkeys(mixers))
    if unknown := sorted(kinds - set(target.mixers)):
        other = _target_for(kinds)
        if other is None:
            return ZebraError(
                f"--to {to}: model.pattern mixes {labels} and no transformers class holds that mix",
                fix=f"export it with --to hf (trust_remote_code); the closest servable recipes: {_servable(kinds)}",
            )
        missing = " / ".join(s.label for s in MIXERS.values() if s.name in unknown)
        return ZebraError(
            f"--to {to}: model.pattern has {missing} sublayers and {target.architecture} has no such layer",
            fix=f"use --to {other}",
        )
    blockers = [b for kind in kinds for b in ADAPTERS[kind].blockers(cfg, target)]
    if blockers:
        b = blockers[0]
        more = f" ({len(blockers) - 1} more setting(s) block it too)" if len(blockers) > 1 else ""
        value = str(b.value).lower() if isinstance(b.value, bool) else b.value
        fits = str(b.fits).lower() if isinstance(b.fits, bool) else b.fits
        return ZebraError(
            f"--to {to}: {b.field}: {value} has no exact equivalent in {target.architecture}: {b.why}{more}",
            fix=f"train with {b.field}: {fits} (or export with --to hf)",
        )
    return None


def layer_types(cfg: Any, to: str) -> list[str]:
    """The native `layer_types` of the model: one entry per mixer/MLP pair."""
    target = TARGETS[to]
    return [target.mixers[MIXERS[c].name][0] for c in cfg.layer_pattern[0::2]]


def plan(cfg: Any, to: str, zebra_names: Sequence[str]) -> list[NativeTensor]:
    """Every tensor of the native checkpoint, in layer order, from the Zebra tensor names `zebra_names`."""
    target = TARGETS[to]
    norm = _minus_one if target.zero_centred_norms else (lambda parts: parts[0])
    out = [NativeTensor("model.embed_tokens.weight", ("model.embeddings.weight",))]
    for i, char in enumerate(cfg.layer_pattern[0::2]):
        kind = MIXERS[char].name
        mixer, mlp = f"model.layers.{2 * i}.", f"model.layers.{2 * i + 1}."
        layer = f"model.layers.{i}."
        out.append(NativeTensor(layer + "input_layernorm.weight", (mixer + "norm.weight",), norm))
        out += ADAPTERS[kind].tensors(cfg, mixer + "mixer.", f"{layer}{target.mixers[kind][1]}.", target)
        out.append(NativeTensor(f"{layer}{target.post_norm}.weight", (mlp + "norm.weight",), norm))
        out += ADAPTERS["mlp"].tensors(cfg, mlp + "mixer.", f"{layer}{target.mlp}.", target)
    out.append(NativeTensor(f"{target.final_norm}.weight", ("model.norm.weight",), norm))
    head = "lm_head.weight" if "lm_head.weight" in zebra_names else "model.embeddings.weight"
    out.append(NativeTensor("lm_head.weight", (head,)))
    return out


def native_config(cfg: Any, to: str, ids: dict[str, int | None]) -> Any:
    """The transformers config object of the export (its own class validates the fields)."""
    from transformers import AutoConfig

    target = TARGETS[to]
    fields = target.config(cfg, layer_types(cfg, to))
    config = AutoConfig.for_model(MODEL_TYPES[to], **fields, **ids)
    config.architectures = [target.architecture]
    return config
