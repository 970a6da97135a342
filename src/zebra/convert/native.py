"""Exports to transformers' own classes: Qwen3-Next / Qwen3.5 (GDN), Bamba and Granite 4.0 hybrid (Mamba2),
Kimi-Linear (KDA + NoPE MLA).

A native layer `i` is the Zebra sublayers `2i` (its mixer) and `2i + 1` (its SwiGLU MLP): the pattern must
alternate mixer and MLP. Each `NativeTarget` says which native module holds which mixer kind, how its norms store
their weight (Qwen's zero-centred `1 + w`) and the class's own part of `config.json`. What a mixer kind becomes is
its spec's `native` adapter (`zebra.mixers.NativeAdapter`, in `zebra.mixers.<name>`): the settings that block an
exact export (a recipe field and the value that fits), its part of `config.json`, and the native tensors, each
built from Zebra tensors by concatenation, row permutation or reshape alone. Nothing is computed approximately: a
model that cannot be written exactly is refused before anything is read or written (`refusal`).

Names, permutations and norms are those of transformers 5.25's
`modeling_{qwen3_next,qwen3_5,bamba,granitemoehybrid,kimi_linear}.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zebra.core.errors import ZebraError
from zebra.mixers import MIXERS, MLP, SWIGLU, NativeAdapter, NativeTensor, mixer_named


@dataclass(frozen=True)
class NativeTarget:
    """One transformers class an export can target (`zebra convert --to NAME`).

    Attributes:
        name: the `--to` value.
        architecture: the class (`config.json` `architectures`).
        mixers: Zebra mixer name -> (native `layer_types` entry, module attribute of the decoder layer); each
            has a `native` adapter in its spec.
        mlp: the decoder layer's MLP attribute; `post_norm` its pre-MLP norm; `final_norm` the model's last norm.
        zero_centred_norms: the layer norms compute `x * (1 + w)` (Qwen): their weight is written as `w - 1`.
        config: `(zebra config, layer_types) -> config.json fields` of the class itself (without the mixers'
            sizes, ids, dtype, architectures).
        stored: `{name: shape}` of the class's parameters -> the names and shapes its checkpoints store, where
            they differ (transformers renames them on load, `conversion_mapping.py`); None where they do not.
        head_when_tied: `lm_head.weight` is written when tied to the embedding too (False: left out, as
            transformers saves a tied head).
    """

    name: str
    architecture: str
    mixers: dict[str, tuple[str, str]]
    mlp: str
    post_norm: str
    final_norm: str
    zero_centred_norms: bool
    config: Callable[[Any, list[str]], dict[str, Any]]
    stored: Callable[[dict[str, tuple[int, ...]]], dict[str, tuple[int, ...]]] | None = None
    head_when_tied: bool = True


def _adapter(name: str) -> NativeAdapter:
    adapter = mixer_named(name).native
    assert adapter is not None, f"mixer {name!r} has no native adapter"  # TARGETS names only mixers that do
    return adapter


def _minus_one(parts: list[Any]) -> Any:
    return parts[0] - 1  # Qwen's RMSNorm multiplies by (1 + w)


# ---------------------------------------------------------------------------------------------- targets
def _common_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    """What every target's config.json holds."""
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
    """Qwen3.5 text (its GDN sizes: `zebra.mixers.gdn`).

    `full_attention_interval` says the same as `layer_types` in the form SGLang reads: its Qwen3-Next / Qwen3.5
    configs (`sglang/srt/configs/qwen3_next.py`, 0.5.23) ignore `layer_types` and make layer `l` full attention
    where `(l + 1) % full_attention_interval == 0`, so one past the layer count means none (every layer is GDN).
    transformers keeps it as a plain attribute when `layer_types` is given.
    """
    assert set(layer_types) == {"linear_attention"}, layer_types  # the Qwen targets hold GDN layers only
    return {
        **_common_config(cfg, layer_types),
        "layer_types": layer_types,
        "full_attention_interval": len(layer_types) + 1,
    }


def _qwen3_next_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    """Qwen3-Next with dense MLPs only (no experts)."""
    n = len(layer_types)
    return {**_qwen_config(cfg, layer_types), "num_experts": 0, "mlp_only_layers": list(range(n))}


def _bamba_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    return {**_common_config(cfg, layer_types), "attn_layer_indices": []}


def _granite_config(cfg: Any, layer_types: list[str]) -> dict[str, Any]:
    """Granite 4.0's hybrid with Mamba2 layers and a dense SwiGLU (`shared_mlp`) after each: no experts, every
    Granite scale 1 (embedding, residual, logits), no position embedding (no attention layer). The Mamba2 class
    that vLLM 0.33 serves (`vllm/model_executor/models/granitemoehybrid.py`; its registry lists Bamba only as
    supported until 0.23) and SGLang 0.5.23 too (`sglang/srt/models/granitemoehybrid.py`; it has no Bamba)."""
    return {
        **_common_config(cfg, layer_types),
        "layer_types": layer_types,
        "num_local_experts": 0,  # vLLM and SGLang build block_sparse_moe only where this is > 0
        "shared_intermediate_size": cfg.intermediate_size,
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "logits_scaling": 1.0,
        "attention_multiplier": 1.0,
        "position_embedding_type": "nope",
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
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": [i + 1 for i in range(n) if i + 1 not in kda],
        },
    }


def _kimi_stored(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Kimi-Linear as Moonshot's checkpoints store it, the form vLLM's and SGLang's loaders read: the forget
    gate's `f_a_proj`, `f_b_proj`, `dt_bias`, `A_log` directly under `self_attn` (transformers 5.25 nests them in
    `forget_gate`), and one short convolution per q / k / v (`q_conv1d`, `k_conv1d`, `v_conv1d`, each [C, 1, W];
    transformers concatenates them into `conv1d` on load). vLLM 0.33 (`vllm/models/kimi_k3/nvidia/model.py`,
    `KimiLinearModel.load_weights`) stacks `.f_a_proj` and `.q_conv1d` into its fused parameters and calls the fused
    conv loader with a shard id that a plain `conv1d` never gets; SGLang 0.5.23 (`sglang/srt/models/kimi_linear.py`)
    does the same with `fused_qkvbfg_a_proj` and `qkv_conv1d`: transformers' names are refused by both."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if ".self_attn.forget_gate." in name:
            out[name.replace(".forget_gate.", ".")] = shape
        elif name.endswith(".self_attn.conv1d.weight"):
            for x in "qkv":
                out[name.replace(".conv1d.", f".{x}_conv1d.")] = (shape[0] // 3, *shape[1:])
        else:
            out[name] = shape
    return out


def stored_shapes(to: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The checkpoint names and shapes of `--to to` from its class's parameter `shapes`."""
    stored = TARGETS[to].stored
    return stored(shapes) if stored else shapes


_QWEN = {
    "mixers": {"gdn": ("linear_attention", "linear_attn")},
    "mlp": "mlp",
    "post_norm": "post_attention_layernorm",
}
TARGETS: dict[str, NativeTarget] = {
    t.name: t
    for t in (
        NativeTarget("qwen3-next", "Qwen3NextForCausalLM", **_QWEN, final_norm="model.norm",
                     zero_centred_norms=True, config=_qwen3_next_config),
        NativeTarget("qwen3.5", "Qwen3_5ForCausalLM", **_QWEN, final_norm="model.norm",
                     zero_centred_norms=True, config=_qwen_config),
        NativeTarget("bamba", "BambaForCausalLM", {"mamba2": ("linear_attention", "mamba")}, "feed_forward",
                     "pre_ff_layernorm", "model.final_layernorm", False, _bamba_config),
        # SGLang's GraniteMoeHybridForCausalLM.load_weights has no `lm_head.weight` to load into when tied
        NativeTarget("granite-hybrid", "GraniteMoeHybridForCausalLM", {"mamba2": ("mamba", "mamba")},
                     "shared_mlp", "post_attention_layernorm", "model.norm", False, _granite_config,
                     head_when_tied=False),
        NativeTarget("kimi-linear", "KimiLinearForCausalLM",
                     {"kda": ("linear_attention", "self_attn"), "mla": ("full_attention", "self_attn")}, "mlp",
                     "post_attention_layernorm", "model.norm", False, _kimi_config, _kimi_stored),
    )
}  # fmt: skip
MODEL_TYPES = {
    "qwen3-next": "qwen3_next",
    "qwen3.5": "qwen3_5_text",
    "bamba": "bamba",
    "granite-hybrid": "granitemoehybrid",
    "kimi-linear": "kimi_linear",
}


def servable_recipes(kinds: set[str]) -> str:
    """Where no class holds a model's mix of mixers: the recipes that export, one for each kind it holds."""
    named = (s.native.servable for s in MIXERS.values() if s.name in kinds and s.native and s.native.servable)
    return ", or ".join(dict.fromkeys(named))


def _target_for(mixers: set[str]) -> str | None:
    """The --to that holds every mixer kind in `mixers`, if any."""
    return next((t.name for t in TARGETS.values() if mixers <= set(t.mixers)), None)


def pairs_refusal(pattern: str, to: str, blocks: str) -> ZebraError | None:
    """The refusal of a `pattern` that is not mixer/MLP pairs, which every native layout (`blocks`: what the
    target calls them) needs, or None."""
    if len(pattern) % 2 or set(pattern[1::2]) != {MLP} or MLP in pattern[0::2]:
        return ZebraError(
            f"--to {to}: model.pattern {pattern!r} does not alternate mixer and MLP; {blocks} are a mixer "
            "followed by an MLP",
            fix=f"train a pattern of mixer/MLP pairs such as {'G-' * 2!r}",
        )
    return None


def refusal(cfg: Any, to: str) -> ZebraError | None:
    """Why the model of `cfg` cannot be written exactly as `--to to` (the first reason), or None.

    Called before anything is read: every reason names the recipe field and the value that would fit.
    """
    target = TARGETS[to]
    mixers = cfg.layer_pattern[0::2]
    if unpaired := pairs_refusal(cfg.layer_pattern, to, f"{target.architecture}'s layers"):
        return unpaired
    kinds = {MIXERS[c].name for c in mixers}
    labels = " + ".join(MIXERS[c].label for c in dict.fromkeys(mixers))
    if unknown := sorted(kinds - set(target.mixers)):
        other = _target_for(kinds)
        if other is None:
            return ZebraError(
                f"--to {to}: model.pattern mixes {labels} and no transformers class holds that mix",
                fix="export it with --to hf (trust_remote_code); the closest servable recipes: "
                + servable_recipes(kinds),
            )
        missing = " / ".join(s.label for s in MIXERS.values() if s.name in unknown)
        return ZebraError(
            f"--to {to}: model.pattern has {missing} sublayers and {target.architecture} has no such layer",
            fix=f"use --to {other}",
        )
    blockers = [b for kind in kinds for b in _adapter(kind).blockers(cfg)]
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
        out += _adapter(kind).tensors(cfg, mixer + "mixer.", f"{layer}{target.mixers[kind][1]}.", to)
        out.append(NativeTensor(f"{layer}{target.post_norm}.weight", (mlp + "norm.weight",), norm))
        out += _adapter(SWIGLU.name).tensors(cfg, mlp + "mixer.", f"{layer}{target.mlp}.", to)
    out.append(NativeTensor(f"{target.final_norm}.weight", ("model.norm.weight",), norm))
    head = "lm_head.weight" if "lm_head.weight" in zebra_names else "model.embeddings.weight"
    if target.head_when_tied or not cfg.tie_word_embeddings:
        out.append(NativeTensor("lm_head.weight", (head,)))
    return out


def native_config(cfg: Any, to: str, ids: dict[str, int | None]) -> Any:
    """The transformers config object of the export (its own class validates the fields)."""
    from transformers import AutoConfig

    target = TARGETS[to]
    fields = target.config(cfg, layer_types(cfg, to))
    for kind in target.mixers:  # each mixer's sizes, whether or not the pattern uses it
        for key, value in _adapter(kind).config(cfg).items():
            fields[key] = {**fields[key], **value} if isinstance(value, dict) and key in fields else value
    config = AutoConfig.for_model(MODEL_TYPES[to], **fields, **ids)
    config.architectures = [target.architecture]
    return config
