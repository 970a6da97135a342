"""Which reader opens a TEACHER argument: a `.gguf` file, a Megatron checkpoint, an HF folder or hub id."""

from __future__ import annotations

import re
from pathlib import Path

from zebra.core.errors import ZebraError
from zebra.upcycle.teachers.teacher import Teacher


def open_teacher(spec: str | Path, *, tokenizer: str | None = None) -> Teacher:
    """Open a teacher: a `.gguf` file, a Megatron checkpoint (root, iteration folder or .pt file), an HF model
    folder or an HF hub id.

    Args:
        spec: the TEACHER argument.
        tokenizer: a tokenizer to use instead of the teacher's (name, path, `byte`, or `none`).

    Raises:
        ZebraError: a missing file or hub id, or a model that is not a dense Llama-family GQA Transformer.
    """
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        from zebra.upcycle.teachers.from_gguf import open_gguf

        if not path.is_file():
            raise ZebraError(f"{spec}: no such file", fix="check the path of the .gguf file")
        teacher = open_gguf(path, with_tokenizer=tokenizer is None)
    elif path.is_file() or (path.is_dir() and not (path / "config.json").is_file()):
        from zebra.upcycle.teachers.from_megatron import open_megatron_teacher

        teacher = open_megatron_teacher(path, with_tokenizer=tokenizer is None)
    elif path.is_dir() or _looks_like_hub_id(str(spec)):
        from zebra.upcycle.teachers.from_hf import open_hf

        teacher = open_hf(str(spec), with_tokenizer=tokenizer is None)
    else:
        raise ZebraError(
            f"{spec}: no such file or folder",
            fix="pass an HF model folder or hub id (org/name), a .gguf file or a Megatron checkpoint",
        )
    if tokenizer is not None:
        from zebra.data.tokenizers import load_tokenizer

        teacher.tokenizer = None if tokenizer == "none" else load_tokenizer(tokenizer)
    return teacher


def _looks_like_hub_id(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", text) is not None and not text.startswith(".")


def save_teacher_tokenizer(spec: str | Path, folder: Path) -> Path:
    """The teacher's own tokenizer (from a .gguf file, a Megatron checkpoint or an HF model) saved in HF layout
    to `folder`, for `zebra data prep --tokenizer FOLDER`; returns `folder`."""
    teacher = open_teacher(spec)
    teacher.tensors.close()
    if teacher.tokenizer is None:
        raise ZebraError(
            f"{spec}: the teacher ships no tokenizer", fix="pass a tokenizer folder or name instead"
        )
    teacher.tokenizer.save_pretrained(folder)
    return folder
