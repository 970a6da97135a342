"""FLA whole-model format: the causal-LM class of each mixer with an FLA adapter (`MixerSpec.fla`:
`GatedDeltaNetForCausalLM`, `KDAForCausalLM`, `GLAForCausalLM`).

One FLA layer is two Zebra sublayers: layer i's `attn_norm` + `attn.*` are sublayer 2i (the mixer), its
`mlp_norm` + `mlp.*` are sublayer 2i+1 (the SwiGLU MLP). The mixers use FLA's own parameterisation in both
libraries, so every tensor converts by renaming alone (`FLA_TO_ZEBRA`). Config fields are FLA 0.6.0's
(fla/models/*/configuration_*.py); fields absent from a config.json take FLA's defaults; each mixer's own fields
are translated by its adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zebra.convert.keymap import KeyMap, plan_keys
from zebra.convert.tensor_sources import ConvertedSource
from zebra.convert.writer import (
    DEFAULT_MAX_SHARD,
    load_tokenizer_to_ship,
    output_dir,
    special_token_ids,
    stored_dtype,
    tensor_specs,
    write_model_files,
)
from zebra.core.device import resolve_dtype
from zebra.core.errors import ZebraError
from zebra.mixers import MIXERS, MLP, MixerSpec
from zebra.spec import arch

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

# Settings every FLA config must have for the model to be a plain mixer + SwiGLU stack (FLA 0.6.0 defaults
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
    "allow_neg_eigval": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
}


def _ffn(cfg: dict[str, Any]) -> int:
    """FLA's GatedMLP width: intermediate_size, else 2/3 * hidden_ratio * hidden rounded up to 256."""
    if cfg.get("intermediate_size"):
        return int(cfg["intermediate_size"])
    n = int(cfg["hidden_size"] * (cfg.get("hidden_ratio") or 4) * 2 / 3)
    return 256 * ((n + 255) // 256)


def fla_mixers() -> dict[str, MixerSpec]:
    """{FLA model_type: the mixer} of the registered mixers with an FLA adapter (`MixerSpec.fla`)."""
    return {m.fla.model_type: m for m in MIXERS.values() if m.fla is not None}


def read_fla_config(directory: Path) -> tuple[MixerSpec, dict[str, Any]]:
    """The mixer and Zebra config kwargs of an FLA checkpoint directory."""
    path = Path(directory) / "config.json"
    cfg = json.loads(path.read_text())
    mixer = fla_mixers().get(cfg.get("model_type"))
    if mixer is None:
        raise ZebraError(
            f"{path}: model_type {cfg.get('model_type')!r} is not an FLA type zebra converts",
            fix=f"zebra converts FLA {', '.join(fla_mixers())} models",
        )
    full = {**_COMMON_DEFAULTS, **mixer.fla.defaults, **cfg, "_source": str(path)}
    for key, want in _REQUIRED.items():
        if full.get(key, want) != want:
            raise ZebraError(
                f"{path}: {key}={full[key]!r} has no Zebra equivalent (needs {want!r})",
                fix=f"only plain {' / '.join(m.label for m in fla_mixers().values())} + SwiGLU FLA models convert",
            )
    n = int(full["num_hidden_layers"])
    zebra = {
        "vocab_size": full["vocab_size"],
        "hidden_size": full["hidden_size"],
        "intermediate_size": _ffn(full),
        "num_hidden_layers": 2 * n,
        "hybrid_attention_ratio": 0.0,
        "layer_pattern": (mixer.char + MLP) * n,
        "rms_norm_eps": full["norm_eps"],
        "tie_word_embeddings": bool(full["tie_word_embeddings"]),
        "initializer_range": full["initializer_range"],
        "max_position_embeddings": full["max_position_embeddings"],
        "bos_token_id": full["bos_token_id"],
        "eos_token_id": full["eos_token_id"],
        "pad_token_id": full["pad_token_id"],
        "recurrent_type": mixer.name,
        **mixer.prefixed(mixer.fla.to_zebra(full)),
    }
    return mixer, zebra


def fla_config(zebra_config: Any, pattern: str) -> dict[str, Any]:
    """FLA's config.json for a pure model of one mixer with an FLA adapter (a one-line error for anything else)."""
    mixers = set(pattern[0::2])
    mlps = set(pattern[1::2])
    mixer = MIXERS.get(next(iter(mixers))) if len(mixers) == 1 and mlps == {MLP} else None
    if mixer is None or mixer.fla is None or len(pattern) % 2:
        pure = " and ".join(f"pure {m.label} ({m.char}{MLP}{m.char}{MLP}...)" for m in fla_mixers().values())
        raise ZebraError(
            f"--to fla: the model's pattern {pattern!r} is a hybrid; FLA has classes for {pure} only",
            fix="convert it with --to hf (the Zebra export loads with trust_remote_code)",
        )
    z = zebra_config
    return {
        "model_type": mixer.fla.model_type,
        "architectures": [mixer.fla.architecture],
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
        **mixer.fla.from_zebra(z),
    }


def fla_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A pure GDN / KDA / GLA Zebra state dict under FLA's names (`ZEBRA_TO_FLA`, the renames `--to fla` writes);
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
    """Write `checkpoint` (a pure model of one mixer with an FLA adapter) as an FLA directory that FLA's classes load.

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
        write_model_files(
            tmp, specs, source, max_shard_size=max_shard_size, on_progress=on_progress, ids=fields, tok=tok
        )
        fields["dtype"] = stored_dtype(specs)
        (tmp / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
    return output
