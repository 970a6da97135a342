"""FLA whole-model format: `GatedDeltaNetForCausalLM` (`gated_deltanet`) and `KDAForCausalLM` (`kda`).

One FLA layer is two Zebra sublayers: layer i's `attn_norm` + `attn.*` are sublayer 2i (the mixer), its
`mlp_norm` + `mlp.*` are sublayer 2i+1 (the SwiGLU MLP). The mixers use FLA's own parameterisation in both
libraries, so every tensor converts by renaming alone (`FLA_TO_ZEBRA`). Config fields are FLA 0.6.0's
(fla/models/{gated_deltanet,kda}/configuration_*.py); fields absent from a config.json take FLA's defaults.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zebra import arch
from zebra.convert.keymap import KeyMap, plan_keys
from zebra.convert.tensor_sources import ConvertedSource
from zebra.convert.writer import (
    DEFAULT_MAX_SHARD,
    load_tokenizer_to_ship,
    output_dir,
    parse_size,
    special_token_ids,
    stored_dtype,
    tensor_specs,
    write_generation_config,
    write_safetensors,
)
from zebra.device import resolve_dtype
from zebra.errors import ZebraError

FLA_TO_ZEBRA = KeyMap(
    {
        "model.embeddings.weight": "model.embeddings.weight",
        "model.layers.{i}.attn_norm.weight": "model.layers.{2i}.norm.weight",
        "model.layers.{i}.attn.{*}": "model.layers.{2i}.mixer.{*}",
        "model.layers.{i}.mlp_norm.weight": "model.layers.{2i+1}.norm.weight",
        "model.layers.{i}.mlp.{*}": "model.layers.{2i+1}.mixer.{*}",
        "model.norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
)
ZEBRA_TO_FLA = FLA_TO_ZEBRA.inverse()

# Settings every FLA config must have for the model to be a plain GDN/KDA + SwiGLU stack (FLA 0.6.0 defaults
# shown); anything else has no Zebra equivalent.
_REQUIRED = {
    "use_short_conv": True,
    "hidden_act": "swish",
    "attn": None,
    "attnres_block_size": None,
    "use_l2warp": False,
}
_COMMON_DEFAULTS = {
    "hidden_size": 2048,
    "max_position_embeddings": 2048,
    "hidden_ratio": 4,
    "intermediate_size": None,
    "norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "vocab_size": 32000,
    "conv_size": 4,
    "num_v_heads": None,
    "allow_neg_eigval": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
}


@dataclass(frozen=True)
class FLAFamily:
    """One FLA model type: its class, Zebra mixer letter and config translation both ways."""

    model_type: str
    architecture: str
    mixer: str  # the Zebra pattern letter
    defaults: dict[str, Any]
    to_zebra: Callable[[dict[str, Any]], dict[str, Any]]
    from_zebra: Callable[[Any], dict[str, Any]]


def _value_dim(cfg: dict[str, Any], source: str) -> int:
    head_v = cfg["head_dim"] * cfg["expand_v"]
    if not math.isclose(head_v, round(head_v)):
        raise ZebraError(f"{source}: head_dim * expand_v = {head_v} is not an integer", fix="fix config.json")
    return round(head_v)


def _ffn(cfg: dict[str, Any]) -> int:
    """FLA's GatedMLP width: intermediate_size, else 2/3 * hidden_ratio * hidden rounded up to 256."""
    if cfg.get("intermediate_size"):
        return int(cfg["intermediate_size"])
    n = int(cfg["hidden_size"] * (cfg.get("hidden_ratio") or 4) * 2 / 3)
    return 256 * ((n + 255) // 256)


def _gdn_to_zebra(cfg: dict[str, Any]) -> dict[str, Any]:
    src = cfg["_source"]
    if not cfg.get("use_gate", True):
        raise ZebraError(
            f"{src}: use_gate=false (GDN without output gate) has no Zebra equivalent",
            fix="Zebra's GDN always gates its output: keep using this model with FLA itself",
        )
    if cfg.get("output_gate_activation", "swish") not in ("swish", "silu"):
        raise ZebraError(
            f"{src}: output_gate_activation={cfg['output_gate_activation']!r} has no Zebra equivalent (swish only)",
            fix="convert a GDN model with the default swish output gate",
        )
    return {
        "recurrent_type": "gdn",
        "gdn_num_heads": cfg["num_heads"],
        "gdn_head_dim": cfg["head_dim"],
        "gdn_num_v_heads": cfg.get("num_v_heads") or cfg["num_heads"],
        "gdn_head_v_dim": _value_dim(cfg, src),
        "gdn_conv_size": cfg["conv_size"],
        "gdn_allow_neg_eigval": bool(cfg.get("allow_neg_eigval", False)),
    }


def _kda_to_zebra(cfg: dict[str, Any]) -> dict[str, Any]:
    src = cfg["_source"]
    if cfg.get("num_v_heads") not in (None, cfg["num_heads"]):
        raise ZebraError(
            f"{src}: num_v_heads={cfg['num_v_heads']} != num_heads={cfg['num_heads']}; Zebra's KDA has one head count",
            fix="convert a KDA model without grouped value heads",
        )
    for flag in ("allow_neg_eigval", "safe_gate"):
        if cfg.get(flag):
            raise ZebraError(
                f"{src}: {flag}=true has no Zebra equivalent",
                fix=f"Zebra's KDA has no {flag}: keep using this model with FLA itself",
            )
    return {
        "recurrent_type": "kda",
        "kda_num_heads": cfg["num_heads"],
        "kda_head_dim": cfg["head_dim"],
        "kda_head_v_dim": _value_dim(cfg, src),
        "kda_conv_size": cfg["conv_size"],
    }


def _gdn_from_zebra(z: Any) -> dict[str, Any]:
    return {
        "head_dim": z.gdn_head_dim,
        "num_heads": z.gdn_num_heads,
        "num_v_heads": z.gdn_num_v_heads,
        "expand_v": z.gdn_head_v_dim / z.gdn_head_dim,
        "conv_size": z.gdn_conv_size,
        "use_gate": True,
        "allow_neg_eigval": bool(getattr(z, "gdn_allow_neg_eigval", False)),
        "output_gate_activation": "swish",
        "fuse_linear_cross_entropy": False,
    }


def _kda_from_zebra(z: Any) -> dict[str, Any]:
    return {
        "head_dim": z.kda_head_dim,
        "num_heads": z.kda_num_heads,
        "num_v_heads": None,
        "expand_v": z.kda_head_v_dim / z.kda_head_dim,
        "conv_size": z.kda_conv_size,
        "allow_neg_eigval": False,
        "safe_gate": False,
        "lower_bound": None,
    }


FLA_FAMILIES: dict[str, FLAFamily] = {
    "gated_deltanet": FLAFamily(
        "gated_deltanet",
        "GatedDeltaNetForCausalLM",
        "G",
        {"head_dim": 256, "num_heads": 6, "expand_v": 2.0, "num_hidden_layers": 21, "use_gate": True},
        _gdn_to_zebra,
        _gdn_from_zebra,
    ),
    "kda": FLAFamily(
        "kda",
        "KDAForCausalLM",
        "K",
        {"head_dim": 128, "num_heads": 16, "expand_v": 1.0, "num_hidden_layers": 24},
        _kda_to_zebra,
        _kda_from_zebra,
    ),
}
FAMILY_OF_MIXER = {f.mixer: f for f in FLA_FAMILIES.values()}


def read_fla_config(directory: Path) -> tuple[FLAFamily, dict[str, Any]]:
    """The FLA family and Zebra config kwargs of an FLA checkpoint directory."""
    path = Path(directory) / "config.json"
    cfg = json.loads(path.read_text())
    family = FLA_FAMILIES.get(cfg.get("model_type"))
    if family is None:
        raise ZebraError(
            f"{path}: model_type {cfg.get('model_type')!r} is not an FLA type zebra converts",
            fix=f"zebra converts FLA {', '.join(FLA_FAMILIES)} models",
        )
    full = {**_COMMON_DEFAULTS, **family.defaults, **cfg, "_source": str(path)}
    for key, want in _REQUIRED.items():
        if full.get(key, want) != want:
            raise ZebraError(
                f"{path}: {key}={full[key]!r} has no Zebra equivalent (needs {want!r})",
                fix="only plain GDN / KDA + SwiGLU FLA models convert",
            )
    n = int(full["num_hidden_layers"])
    zebra = {
        "vocab_size": full["vocab_size"],
        "hidden_size": full["hidden_size"],
        "intermediate_size": _ffn(full),
        "num_hidden_layers": 2 * n,
        "hybrid_attention_ratio": 0.0,
        "layer_pattern": (family.mixer + "-") * n,
        "rms_norm_eps": full["norm_eps"],
        "tie_word_embeddings": bool(full["tie_word_embeddings"]),
        "initializer_range": full["initializer_range"],
        "max_position_embeddings": full["max_position_embeddings"],
        "bos_token_id": full["bos_token_id"],
        "eos_token_id": full["eos_token_id"],
        "pad_token_id": full["pad_token_id"],
        **family.to_zebra(full),
    }
    return family, zebra


def fla_config(zebra_config: Any, pattern: str) -> dict[str, Any]:
    """FLA's config.json for a pure GDN or pure KDA Zebra model (a one-line error for anything else)."""
    mixers = set(pattern[0::2])
    mlps = set(pattern[1::2])
    family = FAMILY_OF_MIXER.get(next(iter(mixers))) if len(mixers) == 1 and mlps == {"-"} else None
    if family is None or len(pattern) % 2:
        raise ZebraError(
            f"--to fla: the model's pattern {pattern!r} is a hybrid; FLA has classes for pure GDN "
            "(G-G-...) and pure KDA (K-K-...) only",
            fix="convert it with --to hf (the Zebra export loads with trust_remote_code)",
        )
    z = zebra_config
    return {
        "model_type": family.model_type,
        "architectures": [family.architecture],
        "attn_mode": "chunk",
        "hidden_size": z.hidden_size,
        "num_hidden_layers": len(pattern) // 2,
        "intermediate_size": z.intermediate_size,
        "hidden_ratio": 4,
        "hidden_act": "swish",
        "norm_eps": z.rms_norm_eps,
        "max_position_embeddings": z.max_position_embeddings,
        "vocab_size": z.vocab_size,
        "tie_word_embeddings": bool(z.tie_word_embeddings),
        "initializer_range": z.initializer_range,
        "use_short_conv": True,
        "use_cache": True,
        "attn": None,
        "fuse_norm": True,
        "fuse_swiglu": True,
        "fuse_cross_entropy": True,
        "use_l2warp": False,
        "attnres_block_size": None,
        "bos_token_id": getattr(z, "bos_token_id", None),
        "eos_token_id": getattr(z, "eos_token_id", None),
        "pad_token_id": getattr(z, "pad_token_id", None),
        **family.from_zebra(z),
    }


def fla_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A pure GDN / KDA Zebra state dict under FLA's names (`ZEBRA_TO_FLA`, the renames `--to fla` writes);
    the tensors themselves are shared, not copied. FLA's class loads it with `load_state_dict(strict=True)`."""
    return {ZEBRA_TO_FLA.rename(key): tensor for key, tensor in state_dict.items()}


def export_fla(
    checkpoint: Any,
    output: Path,
    *,
    tokenizer: Any = None,
    dtype: str = "auto",
    force: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD,
    on_progress: Callable[[float, float | None, str], None] | None = None,
) -> Path:
    """Write `checkpoint` (a pure GDN or pure KDA model) as an FLA directory that FLA's classes load.

    Args:
        checkpoint: a `zebra.convert.formats.Checkpoint`.
        output: the FLA directory (written to a temporary folder, then renamed).
        tokenizer: as `export_hf`'s: a name / folder / `byte`, a loaded tokenizer, or None / "none".
        dtype: "auto" keeps each tensor's dtype; "bf16" / "fp16" / "fp32" / "fp64" casts floating tensors.
        force: replace an existing output.
        max_shard_size: largest safetensors shard ("5GB", "500MB" or bytes).
        on_progress: called after each tensor with (bytes written, total bytes, the tensor's name).
    """
    config = checkpoint.config
    fields = fla_config(config, arch.resolve_pattern(config))
    shapes = checkpoint.tensors.shapes()
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)  # saved once, as FLA's tied head expects
    pieces = plan_keys(ZEBRA_TO_FLA, shapes, {}, origin=checkpoint.tensors.origin, fix="report this as a bug")
    source = ConvertedSource(checkpoint.tensors, pieces)
    specs = tensor_specs(source.shapes(), resolve_dtype(dtype))
    tok = load_tokenizer_to_ship(tokenizer)
    fields.update(special_token_ids(fields, tok))
    with output_dir(output, force=force) as tmp:
        write_safetensors(
            tmp,
            specs,
            source.get,
            max_shard_bytes=parse_size(max_shard_size),
            on_progress=on_progress,
            origin=source.origin,
        )
        fields["dtype"] = stored_dtype(specs)
        (tmp / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
        write_generation_config(tmp, fields)
        if tok is not None:
            tok.save_pretrained(tmp)
    return output
