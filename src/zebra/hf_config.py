"""An HF-layout folder's `config.json`, read without torch (format detection and model loading share it)."""

from __future__ import annotations

import json
from pathlib import Path

from zebra.errors import ZebraError


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
