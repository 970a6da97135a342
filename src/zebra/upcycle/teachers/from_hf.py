"""Hugging Face teachers: a local model folder or a hub id (config.json + safetensors, or pytorch_model.bin)."""

from __future__ import annotations

import json
from pathlib import Path

from zebra.core.errors import ZebraError
from zebra.upcycle.teachers.teacher import EMBED, Teacher, check_tensors, shape_from_hf_config

# What a hub download fetches: config, weights and tokenizer files, never other formats' copies of the weights.
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.tiktoken"]


def open_hf(spec: str, *, with_tokenizer: bool = True) -> Teacher:
    """Open an HF causal LM folder (or download a hub id's config, safetensors and tokenizer files)."""
    from zebra.convert.tensor_sources import SafetensorsSource, StateDictSource, torch_load

    folder = Path(spec).expanduser()
    if not folder.is_dir():
        folder = _download(spec)
    config_file = folder / "config.json"
    try:
        cfg = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ZebraError(
            f"{config_file}: unreadable ({e})", fix="point at a complete HF model folder"
        ) from None
    shape = shape_from_hf_config(cfg, str(folder))
    if any(folder.glob("*.safetensors")):
        tensors = SafetensorsSource(folder)
    elif (folder / "pytorch_model.bin").is_file():
        tensors = StateDictSource(torch_load(folder / "pytorch_model.bin"), origin=str(folder))
    else:
        raise ZebraError(
            f"{folder}: no model.safetensors or pytorch_model.bin",
            fix="point at a folder that holds the weights",
        )
    shapes = {name: s for name, (s, _) in tensors.shapes().items()}
    check_tensors(shape, shapes, str(folder))
    dtype = tensors.shapes()[EMBED][1]
    return Teacher(shape, tensors, _tokenizer(folder) if with_tokenizer else None, spec, "hf", dtype)


def _download(repo_id: str) -> Path:
    """The hub id's files in the local HF cache (downloaded when the hub is reachable)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as e:  # huggingface_hub raises its own OSError / HTTP subclasses
        text = str(e)
        if "gated" in text.lower() or "401" in text or "403" in text:
            raise ZebraError(
                f"{repo_id}: the repository is gated and access was refused",
                fix="accept its license on huggingface.co and set HF_TOKEN (or run `hf auth login`)",
            ) from None
        raise ZebraError(
            f"{repo_id}: no such local folder, and the hub id is not available ({type(e).__name__})",
            fix="check the path or the hub id (org/name), and the network (HF_HUB_OFFLINE unset)",
        ) from None


def _tokenizer(folder: Path):
    """The folder's tokenizer, or None when it has no tokenizer files."""
    if not any(
        (folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return None
    from zebra.data.tokenizers import load_tokenizer

    return load_tokenizer(str(folder))
