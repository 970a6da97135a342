"""`zebra train --init DIR`: the student starts from an export's weights (e.g. `zebra upcycle`'s) at step 0.

`init_overrides` gives the recipe the export's model shapes and records the folder as `train.init`; the trainer
calls `load_init` only when no checkpoint is restored (a resume takes the checkpoint). Every key and shape must
match the student's, or a one-line error names the first that does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import torch


def init_overrides(folder: str | Path) -> dict[str, Any]:
    """Typed recipe overrides for `--init DIR`: `train.init` (absolute) and the export's model shapes."""
    from zebra.recipes.schema import ModelSpec

    path = Path(folder).expanduser().resolve()
    config = path / "config.json"
    _check_export_folder(folder, path)
    try:
        cfg = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ZebraError(
            f"--init {folder}: {config} unreadable ({type(e).__name__})",
            fix="pass an export folder (zebra upcycle's output, or a run's export/)",
        ) from None
    if cfg.get("model_type") != "zebra":
        raise ZebraError(
            f"--init {folder}: model_type {cfg.get('model_type')!r}, not a Zebra export",
            fix="upcycle the model first (zebra upcycle MODEL --output DIR), then pass --init DIR",
        )
    return {"train.init": str(path), **ModelSpec.overrides_from_config(cfg)}


def _check_export_folder(folder: str | Path, path: Path) -> None:
    """A missing folder, or a training run's folder instead of its export, told as such."""
    fix = "pass an export folder (zebra upcycle's output, or a run's export/)"
    if not path.is_dir():
        raise ZebraError(f"--init {folder}: no such folder", fix=fix)
    if not (path / "config.json").exists() and (path / "config.yaml").is_file():
        export = Path(folder) / "export"
        raise ZebraError(
            f"--init {folder}: a training run folder, not an export",
            fix=f"did you mean --init {export}"
            if (path / "export" / "config.json").is_file()
            else f"export its latest checkpoint first: zebra convert {folder}, then --init {export}",
        )


def init_state(folder: str | Path, config: Any) -> dict[str, Any]:
    """The export's tensors for a ZebraForCausalLM of `config`, in float32 (the master weights); refuses a
    missing, extra or differently shaped key with one line naming it."""
    import torch

    from zebra.convert.tensor_sources import SafetensorsSource
    from zebra.models import ZebraForCausalLM

    with torch.device("meta"):
        expected = dict(ZebraForCausalLM(config).state_dict())  # the names and shapes, no memory
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    source = SafetensorsSource(Path(folder))
    try:
        found = {name: shape for name, (shape, _) in source.shapes().items()}
        for name, tensor in expected.items():
            if name not in found:
                _mismatch(folder, f"has no {name} (the student needs it, shape {list(tensor.shape)})")
            if tuple(found[name]) != tuple(tensor.shape):
                _mismatch(folder, f"{name} is {list(found[name])}, the student's {list(tensor.shape)}")
        extra = sorted(set(found) - set(expected) - {"lm_head.weight"})
        if extra:
            _mismatch(folder, f"{extra[0]} is not a tensor of the student")
        return {name: source.get(name).to(torch.float32) for name in expected}
    finally:
        source.close()


def _mismatch(folder: str | Path, problem: str) -> None:
    raise ZebraError(
        f"train.init {folder}: {problem}",
        fix="start from an export of this recipe's model (--init sets model.* from the export's config.json)",
    )


def load_init(model: torch.nn.Module, config: Any, folder: str | Path) -> None:
    """Load the export in `folder` into the (wrapped) student `model` of `config`; every rank reads the full
    weights (FSDP2 keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = init_state(folder, config)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embeddings.weight"]
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
