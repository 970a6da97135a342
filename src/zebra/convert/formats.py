"""Source formats: detection and opening, each as a Zebra config plus tensors under Zebra names.

| name       | what it is                                              | detected by                              |
|------------|---------------------------------------------------------|------------------------------------------|
| `hf`       | a Zebra HF export                                       | config.json with model_type "zebra"      |
| `fla`      | FLA GatedDeltaNetForCausalLM / KDAForCausalLM directory | config.json with model_type gated_deltanet / kda |
| `zebra`    | a Zebra training run, its checkpoints/ or a step_XXXXXXX | config.yaml + checkpoints/, `latest`, or .metadata + meta.json |
| `megatron` | Primus / Megatron-LM `torch` or `torch_dist` checkpoint | latest_checkpointed_iteration.txt, mp_rank_00/, .metadata + common.pt, or a .pt file |

Detection asks each format's probe in the table's order; the first that recognises the path wins. Nothing
dispatches on name prefixes: FLA families are looked up by `model_type`, Megatron layer kinds by the tensors
each layer holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebra.convert.fla_format import FLA_TO_ZEBRA, fla_mixers, read_fla_config
from zebra.convert.keymap import plan_keys
from zebra.convert.megatron import is_torch_dist, is_torch_format, read_megatron, resolve_iteration_dir
from zebra.convert.tensor_sources import (
    ConvertedSource,
    DCPSource,
    SafetensorsSource,
    StateDictSource,
    TensorSource,
    torch_load,
)
from zebra.core.errors import ZebraError
from zebra.data.tokenizers import has_tokenizer_files
from zebra.folders.checkpoint_dir import committed, is_complete, read_hold
from zebra.folders.model_folder import config_model_type, existing_path
from zebra.models import ZebraConfig
from zebra.recipes import load_recipe


@dataclass
class Checkpoint:
    """A model ready to convert or verify.

    Attributes:
        format: detected format, e.g. `hf`, `fla`, `zebra`, `megatron-torch_dist`.
        path: what the user pointed at.
        config: the `ZebraConfig`.
        tensors: a lazy source under `ZebraForCausalLM.state_dict()` names.
        tokenizer: tokenizer name or directory recorded by the source (None when unknown).
        recipe: the training recipe, for Zebra runs.
        step: the training step of a Zebra run's checkpoint (None for other formats).
        notes: things the user should know (folded norms, dropped tensors).
    """

    format: str
    path: Path
    config: Any
    tensors: TensorSource
    tokenizer: str | None = None
    recipe: Any = None
    notes: list[str] = field(default_factory=list)
    step: int | None = None


@dataclass(frozen=True)
class Format:
    probe: Callable[[Path], bool]
    open: Callable[[Path], Checkpoint]
    describe: str


def _weights(path: Path) -> TensorSource:
    if (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file():
        return SafetensorsSource(path)
    if (path / "pytorch_model.bin").is_file():
        return StateDictSource(torch_load(path / "pytorch_model.bin"), origin=str(path / "pytorch_model.bin"))
    raise ZebraError(
        f"{path}: config.json but no model.safetensors or pytorch_model.bin", fix="copy the weights too"
    )


# ---- Zebra HF export -------------------------------------------------------------------------------------


def _is_export(path: Path) -> bool:
    return path.is_dir() and config_model_type(path) == "zebra"


def _open_export(path: Path) -> Checkpoint:
    config = ZebraConfig.from_pretrained(path)
    return Checkpoint(
        "hf", path, config, _weights(path), tokenizer=str(path) if has_tokenizer_files(path) else None
    )


# ---- FLA -------------------------------------------------------------------------------------------------


def _is_fla(path: Path) -> bool:
    return path.is_dir() and config_model_type(path) in fla_mixers()


def _open_fla(path: Path) -> Checkpoint:
    mixer, kwargs = read_fla_config(path)
    raw = _weights(path)
    pieces = plan_keys(
        FLA_TO_ZEBRA,
        raw.shapes(),
        {},
        origin=raw.origin,
        fix=f"not a plain FLA {mixer.fla.architecture} checkpoint",
    )
    return Checkpoint(
        "fla",
        path,
        zebra_config(kwargs),
        ConvertedSource(raw, pieces),
        tokenizer=str(path) if has_tokenizer_files(path) else None,
    )


# ---- Zebra training runs ---------------------------------------------------------------------------------


def _step_dir(path: Path) -> Path | None:
    """The checkpoint a run dir / checkpoints dir / step dir stands for (`latest` first)."""

    if is_complete(path):
        return path
    for folder in (path / "checkpoints", path):
        found = committed(folder)
        if found:
            return found[0]
    return None


def _is_zebra_run(path: Path) -> bool:
    return path.is_dir() and not (path / "common.pt").is_file() and _step_dir(path) is not None


def _check_run_has_a_checkpoint(path: Path) -> None:
    """A ZebraError for a training run folder that has saved no checkpoint yet (else what it is is unclear)."""
    if path.is_dir() and (path / "config.yaml").is_file() and _step_dir(path) is None:
        raise ZebraError(
            f"{path}: a training run with no checkpoint yet",
            fix="use it once it has saved one (every train.save_interval steps, and at the end of the run)",
        )


def _open_zebra_run(path: Path) -> Checkpoint:
    step, hold = _held_step(path)
    try:
        run = step.parent.parent
        recipe_file = run / "config.yaml"
        if not recipe_file.is_file():
            raise ZebraError(
                f"{step}: no {recipe_file} next to its checkpoints/",
                fix="convert the checkpoint inside its run directory (the run's config.yaml holds the architecture)",
            )
        recipe = load_recipe(str(recipe_file))
        tensors = DCPSource(step, lambda k: k[len("model.") :] if k.startswith("model.") else None, hold=hold)
    except BaseException:
        if hold is not None:
            os.close(hold)
        raise
    return Checkpoint(
        "zebra",
        path,
        recipe.model.to_config(),
        tensors,
        tokenizer=recipe.data.tokenizer,
        recipe=recipe,
        step=int(step.name.removeprefix("step_")),
    )


def _held_step(path: Path) -> tuple[Path, int | None]:
    """The checkpoint `path` stands for, held against a live run's keep_last pruning (`read_hold`) until the
    source is closed. A step pruned before it could be held is replaced by the run's next `latest`."""
    for _ in range(20):
        step = _step_dir(path)
        if step is None:
            break
        hold = read_hold(step)
        if hold is not None or is_complete(step):
            return step, hold
    raise ZebraError(
        f"{path}: the checkpoint was removed while it was being opened (a running training prunes old ones, "
        "train.keep_last)",
        fix="convert the run folder, which follows its newest checkpoint, or raise train.keep_last",
    )


# ---- Primus / Megatron -----------------------------------------------------------------------------------


def _is_megatron(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".pt"
    if (path / "latest_checkpointed_iteration.txt").is_file():
        return True
    directory = resolve_iteration_dir(path)
    return is_torch_format(directory) or is_torch_dist(directory)


def _open_megatron(path: Path) -> Checkpoint:
    kwargs, tensors, info = read_megatron(path)
    return Checkpoint(
        info["format"], path, zebra_config(kwargs), tensors, info["tokenizer"], notes=info["notes"]
    )


FORMATS: dict[str, Format] = {
    "hf": Format(_is_export, _open_export, "a Zebra HF export (config.json, model_type zebra)"),
    "fla": Format(_is_fla, _open_fla, "an FLA gated_deltanet / kda directory"),
    "zebra": Format(_is_zebra_run, _open_zebra_run, "a Zebra training run or checkpoint"),
    "megatron": Format(_is_megatron, _open_megatron, "a Primus/Megatron torch or torch_dist checkpoint"),
}


def detect_format(path: str | Path) -> str:
    """The name of the format at `path` (a key of FORMATS), or a one-line ZebraError."""
    path = existing_path(path)
    for name, fmt in FORMATS.items():
        if fmt.probe(path):
            return name
    _check_run_has_a_checkpoint(path)
    model_type = config_model_type(path) if path.is_dir() else None
    if model_type is not None:
        raise ZebraError(
            f"{path}: config.json has model_type {model_type!r}, not a model zebra converts",
            fix="zebra converts zebra exports and FLA gated_deltanet / kda models",
        )
    raise ZebraError(
        f"{path}: unknown checkpoint format",
        fix="expected " + "; ".join(f.describe for f in FORMATS.values()),
    )


def open_checkpoint(path: str | Path, fmt: str = "auto") -> Checkpoint:
    """Open any supported source as a `Checkpoint` (config + lazy tensors under Zebra names).

    Args:
        path: file or directory.
        fmt: "auto" (detect) or one of FORMATS (`hf`, `fla`, `zebra`, `megatron`).
    """
    path = existing_path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    elif fmt not in FORMATS:
        raise ZebraError(f"--from {fmt}: unknown format", fix=f"use auto or one of {', '.join(FORMATS)}")
    elif not FORMATS[fmt].probe(path):
        _check_run_has_a_checkpoint(path)
        raise ZebraError(f"{path}: not {FORMATS[fmt].describe}", fix="check the path, or use --from auto")
    return FORMATS[fmt].open(path)


def zebra_config(kwargs: dict[str, Any]) -> Any:
    """`ZebraConfig(**kwargs)`, its ValueError as a one-line ZebraError.

    Foreign configs carry only the sizes of the mixers they use; the other mixers keep ZebraConfig's defaults,
    which it does not check (it checks only the mixers the pattern uses).
    """
    try:
        return ZebraConfig(**kwargs)
    except ValueError as e:
        raise ZebraError(f"{e}", fix="the checkpoint's configuration is not a valid Zebra model") from None
