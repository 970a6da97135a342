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

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from zebra.convert.audit import zebra_audit
from zebra.convert.model_card import model_card
from zebra.convert.tensor_sources import StateDictSource, TensorSource
from zebra.convert.writer import (
    DEFAULT_MAX_SHARD,
    SPECIAL_TOKEN_IDS,
    load_tokenizer_to_ship,
    output_dir,
    special_token_ids,
    stored_dtype,
    tensor_specs,
    write_model_files,
)
from zebra.core.device import resolve_dtype
from zebra.core.errors import ZebraError
from zebra.models.remote_code import write_remote_code


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
    on_progress: Callable[[float, float | None, str], None] | None = None,
    add_files: Callable[[Path], None] | None = None,
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
        on_progress: called after each tensor with (bytes written, total bytes, the tensor's name).
        add_files: called with the temporary directory once everything else is written, before it is renamed
            into place, to add files of the caller's (`zebra upcycle`'s upcycle.json).

    Returns:
        The export directory.

    Raises:
        ZebraError: missing / unexpected / mis-shaped tensors (nothing is written), an existing output
            without `force`, an unknown dtype.
    """
    config, recipe = _config_and_recipe(model, recipe)
    if tokenizer is None and recipe is not None:
        tokenizer = recipe.data.tokenizer
    cast = resolve_dtype(dtype)
    src = tensors if isinstance(tensors, TensorSource) else StateDictSource(tensors)
    shapes = src.shapes()
    zebra_audit({k: s for k, (s, _) in shapes.items()}, config).raise_if_failed(source or src.origin)
    specs = tensor_specs(shapes, cast, skip={"lm_head.weight"} if config.tie_word_embeddings else ())
    tok = load_tokenizer_to_ship(tokenizer)
    ids = special_token_ids({n: getattr(config, n, None) for n in SPECIAL_TOKEN_IDS}, tok)
    for name, value in ids.items():
        if value is not None:
            setattr(config, name, value)
    with output_dir(Path(output), force=force) as tmp:
        config.auto_map = write_remote_code(tmp)
        config.architectures = ["ZebraForCausalLM"]
        config.dtype = stored_dtype(specs)
        # the kernels are the loading machine's choice: a run's forced backend (the torch reference for debugging,
        # fla or mamba_ssm on GPUs, where a CPU cannot run them) does not travel with the weights
        config.kernel_backend = "auto"
        write_model_files(
            tmp, specs, src, max_shard_size=max_shard_size, on_progress=on_progress, ids=ids, tok=tok
        )
        config.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(config, recipe=recipe, source=source, tokenizer=tok))
        if add_files is not None:
            add_files(tmp)
    return Path(output)


def _config_and_recipe(model: Any, recipe: Any) -> tuple[Any, Any]:
    if hasattr(model, "model") and hasattr(model.model, "to_config"):  # a Recipe
        return model.model.to_config(), model
    if getattr(model, "model_type", None) == "zebra":
        return copy.deepcopy(model), recipe
    raise ZebraError(
        f"export_hf: model must be a Recipe or a ZebraConfig, got {type(model).__name__}",
        fix="pass the run's recipe or the model's config",
    )
