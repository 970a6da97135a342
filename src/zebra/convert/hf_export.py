"""`export_hf`: the one writer of Zebra's Hugging Face export directory (used by `zebra convert` and the trainer).

Layout (design.md):

    config.json               model_type "zebra", architectures, auto_map -> the remote-code files below
    model.safetensors         or model-0000K-of-0000N.safetensors + model.safetensors.index.json
    generation_config.json    bos / eos / pad ids
    tokenizer files           when a tokenizer is given
    configuration_zebra.py, modeling_zebra.py, ...   flat trust_remote_code files (zebra.models.remote_code)
    README.md                 model card: architecture, pattern, parameters, recipe, how to load

Everything is written into a temporary folder next to the output and renamed into place at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.convert.audit import zebra_audit
from zebra.convert.progress import tensor_progress
from zebra.convert.sources import StateDictSource, TensorSource
from zebra.convert.writer import (
    DEFAULT_MAX_SHARD,
    TensorSpec,
    output_dir,
    parse_size,
    stored_dtype,
    write_safetensors,
)
from zebra.errors import ZebraError

if TYPE_CHECKING:
    import torch

DTYPES = {"auto": None, "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def export_hf(
    tensors: Mapping[str, torch.Tensor] | TensorSource,
    model: Any,
    output: str | Path,
    *,
    tokenizer: Any = None,
    recipe: Any = None,
    dtype: str = "auto",
    force: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD,
    source: str | None = None,
    progress: bool = False,
) -> Path:
    """Write a Zebra HF export directory that `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`
    loads without zebra installed.

    Args:
        tensors: `ZebraForCausalLM.state_dict()` names -> tensors: a plain state dict (the trainer's full
            state dict) or a lazy `TensorSource` (conversions; read one tensor at a time).
        model: a `zebra.recipes.Recipe` (config, tokenizer and model-card recipe all come from it) or a
            `ZebraConfig`.
        output: the export directory.
        tokenizer: tokenizer name/path (`byte`, a hub id, a directory), a loaded tokenizer, or None. Defaults to
            the recipe's `data.tokenizer` when `model` is a Recipe. The string "none" skips tokenizer files.
        recipe: the training recipe for the model card when `model` is a ZebraConfig.
        dtype: "auto" keeps each tensor's dtype; "bf16" / "fp16" / "fp32" / "fp64" casts floating tensors.
        force: replace an existing `output` (otherwise a ZebraError).
        max_shard_size: largest safetensors shard ("5GB", "500MB" or bytes); larger models are sharded with
            an index file.
        source: what the weights were converted from (model card provenance).
        progress: show a per-tensor progress bar on stderr.

    Returns:
        The export directory.

    Raises:
        ZebraError: missing / unexpected / mis-shaped tensors (nothing is written), an existing output
            without `force`, an unknown dtype.
    """
    import torch

    from zebra.convert.model_card import model_card

    config, recipe = _config_and_recipe(model, recipe)
    if tokenizer is None and recipe is not None:
        tokenizer = recipe.data.tokenizer
    if dtype not in DTYPES:
        raise ZebraError(f"--dtype {dtype}: unknown", fix=f"use one of {', '.join(DTYPES)}")
    cast = getattr(torch, DTYPES[dtype]) if DTYPES[dtype] else None
    src = tensors if isinstance(tensors, TensorSource) else StateDictSource(tensors)
    shapes = src.shapes()
    zebra_audit({k: s for k, (s, _) in shapes.items()}, config).raise_if_failed(source or src.origin)
    tied = bool(config.tie_word_embeddings)
    specs = [
        TensorSpec(name, shape, cast if cast is not None and dt.is_floating_point else dt)
        for name, (shape, dt) in shapes.items()
        if not (tied and name == "lm_head.weight")
    ]
    tok = _load_tokenizer(tokenizer)
    _fill_special_ids(config, tok)
    with output_dir(Path(output), force=force) as tmp:
        from zebra.models.remote_code import write_remote_code

        config.auto_map = write_remote_code(tmp)
        config.architectures = ["ZebraForCausalLM"]
        config.dtype = stored_dtype(specs)
        with tensor_progress(specs, "export", enabled=progress) as advance:
            write_safetensors(
                tmp,
                specs,
                src.get,
                max_shard_bytes=parse_size(max_shard_size),
                on_tensor=advance,
                origin=src.origin,
            )
        config.save_pretrained(tmp)
        _write_generation_config(tmp, config)
        if tok is not None:
            tok.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(config, recipe=recipe, source=source, tokenizer=tok))
    return Path(output)


def _config_and_recipe(model: Any, recipe: Any) -> tuple[Any, Any]:
    if hasattr(model, "model") and hasattr(model.model, "to_config"):  # a Recipe
        return model.model.to_config(), model
    if getattr(model, "model_type", None) == "zebra":
        import copy

        return copy.deepcopy(model), recipe
    raise ZebraError(
        f"export_hf: model must be a Recipe or a ZebraConfig, got {type(model).__name__}",
        fix="pass the run's recipe or the model's config",
    )


def _load_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None or tokenizer == "none":
        return None
    if not isinstance(tokenizer, str | Path):
        return tokenizer
    from zebra.data.tokenizers import load_tokenizer

    return load_tokenizer(str(tokenizer))


def _fill_special_ids(config: Any, tok: Any) -> None:
    """Take bos / eos / pad ids from the tokenizer where the config has none."""
    if tok is None:
        return
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(config, name, None) is None and getattr(tok, name, None) is not None:
            setattr(config, name, getattr(tok, name))


def _write_generation_config(directory: Path, config: Any) -> None:
    from transformers import GenerationConfig

    GenerationConfig(
        bos_token_id=getattr(config, "bos_token_id", None),
        eos_token_id=getattr(config, "eos_token_id", None),
        pad_token_id=getattr(config, "pad_token_id", None),
    ).save_pretrained(directory)
