"""Where a command's checkpoint or model argument points, read without torch: the commands check it before they
import the model library (seconds), and format detection and model loading read the folder's `config.json` one
way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zebra.core.errors import ZebraError

MODEL_FIX = "pass an export directory, an FLA directory or a training run directory"


def existing_path(path: str | Path, *, what: str = "", fix: str = "check the path") -> Path:
    """`path` (user's `~` expanded), or a one-line ZebraError when nothing is there; `what` names the argument in
    the message (e.g. "MODEL")."""
    found = Path(path).expanduser()
    if not found.exists():
        raise ZebraError(f"{what + ' ' if what else ''}{path}: no such file or directory", fix=fix)
    return found


def model_path(model: str | Path) -> Path:
    """The directory MODEL (an export, FLA, HF or run directory) names, or a one-line ZebraError."""
    path = existing_path(model, what="MODEL", fix=MODEL_FIX)
    if not path.is_dir():
        raise ZebraError(f"MODEL {model}: not a directory", fix="pass the folder that holds config.json")
    return path


def model_dir_or_recipe(spec: str) -> Path | Any:
    """What a benchmark's MODEL names: a model directory (its Path), else the recipe of that name or YAML path
    (a `Recipe`, built with random weights), else a one-line ZebraError."""
    from zebra.recipes import load_recipe

    if Path(spec).is_dir():
        return Path(spec)
    try:
        return load_recipe(spec)
    except ZebraError as e:
        raise ZebraError(
            f"MODEL {spec}: not a model directory, and not a recipe ({e.message})",
            fix="pass an export / FLA / run directory or a recipe name (zebra recipes list)",
        ) from None


def config_model_type(folder: Path) -> str | None:
    """`folder/config.json`'s `model_type` (None: no config.json there, or no model_type in it); a one-line
    ZebraError when the file is not a JSON object."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise ZebraError(
            f"{config}: not valid JSON ({e})", fix="re-export or re-download the model"
        ) from None
    if not isinstance(data, dict):
        raise ZebraError(f"{config}: not a JSON object", fix="re-export or re-download the model")
    model_type = data.get("model_type")
    return str(model_type) if model_type else None


def check_output(path: str | Path, *, force: bool, flag: str = "--output") -> None:
    """Refuse an output folder that exists without `force`, or that `force` may not replace (`check_replaceable`):
    told before the work that would fill it."""
    path = Path(path)
    if path.exists() and not force:
        raise ZebraError(
            f"{flag} {path}: already exists", fix="pass --force to overwrite it, or choose another path"
        )
    check_replaceable(path, flag=flag)


def check_replaceable(path: Path, *, flag: str = "--output") -> None:
    """Refuse an output folder whose replacement would delete what is not a model: an existing `path` must be a
    directory, and empty or a model folder (config.json). `--force` replaces model folders only."""
    if not path.exists():
        return
    if not path.is_dir():
        raise ZebraError(f"{flag} {path}: exists and is not a directory", fix="choose another path")
    if any(path.iterdir()) and not (path / "config.json").is_file():
        raise ZebraError(  # e.g. a data or home folder given by mistake
            f"{flag} {path}: holds files but no config.json, so it is not a model folder, and replacing it "
            "would delete them",
            fix="choose another path (or empty that folder yourself)",
        )
