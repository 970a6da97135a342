"""The teacher of a distillation run: checked against the student and the data before any rank starts, then
loaded by every rank as a frozen Hugging Face causal LM.

    check_teacher(recipe)            one-line ZebraError when teacher, student and data do not share a tokenizer
    load_teacher(spec, env, mode)    the teacher in eval mode without gradients, bf16 on a GPU (float32 on CPU),
                                     sharded like the student under FSDP2 and replicated otherwise

Any teacher `zebra upcycle` reads works (`zebra.upcycle.open_teacher`): an HF folder or hub id, a `.gguf` file,
a dense Megatron checkpoint. The model is rebuilt from its shape (an HF folder or hub id: from its own
config.json, so RoPE scaling is kept) and filled tensor by tensor (`zebra.upcycle.teachers.causal_lm`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import torch

    from zebra.recipes import Recipe
    from zebra.train.dist import DistEnv


def check_teacher(recipe: Recipe) -> None:
    """Refuse a teacher whose vocabulary differs from the student's (`model.vocab_size`), the data's tokenizer
    (`data.tokenizer` and each prepared folder's manifest) or the `train.init` export's tokenizer."""
    from zebra.upcycle import open_teacher

    spec = recipe.distill.teacher
    teacher = open_teacher(spec)
    try:
        vocab = teacher.shape.vocab_size
        if vocab != recipe.model.vocab_size:
            raise ZebraError(
                f"distill.teacher {spec}: {vocab} logits per token but the student has model.vocab_size "
                f"{recipe.model.vocab_size}",
                fix="distil into a student of the teacher's vocabulary (zebra upcycle TEACHER, then --init)",
            )
        if teacher.tokenizer is not None:
            _check_same_tokenizer(recipe, spec, teacher.tokenizer)
    finally:
        teacher.tensors.close()


def _check_same_tokenizer(recipe: Recipe, spec: str, tokenizer: Any) -> None:
    """The teacher's tokenizer (size + vocabulary hash) against the data's and the init export's."""
    from zebra.data import load_tokenizer, read_manifest
    from zebra.data.paths import prep_folder
    from zebra.data.tokenizers import export_vocabulary, recorded_vocabulary, vocabulary

    want = vocabulary(tokenizer)
    others: list[tuple[str, tuple[int, str]]] = []
    if not recipe.data.mock:
        others.append(
            (f"data.tokenizer {recipe.data.tokenizer}", vocabulary(load_tokenizer(recipe.data.tokenizer)))
        )
        for entry in recipe.data.paths:
            folder = prep_folder(entry.target)
            recorded = recorded_vocabulary(read_manifest(folder).tokenizer) if folder is not None else None
            if recorded is not None:
                others.append((f"--data {entry}", recorded))
    if recipe.train.init and (init_vocabulary := export_vocabulary(Path(recipe.train.init))) is not None:
        others.append((f"train.init {recipe.train.init}", init_vocabulary))
    for what, found in others:
        if found != want:
            raise ZebraError(
                f"distill.teacher {spec}: its tokenizer ({want[0]} ids, vocabulary {want[1][:12]}) differs "
                f"from {what} ({found[0]} ids, vocabulary {found[1][:12]})",
                fix="use the teacher's tokenizer everywhere: prepare the data with --tokenizer set to it and "
                "--set data.tokenizer=<it>",
            )


def load_teacher(spec: str, env: DistEnv, *, mode: str) -> torch.nn.Module:
    """The teacher for one rank: frozen, eval mode, bf16 on a GPU (float32 on CPU), on `env.device`;
    `mode` "fsdp" shards it over the ranks (every decoder layer, then the root), else it is replicated."""
    from zebra.upcycle import open_teacher
    from zebra.upcycle.teachers.causal_lm import (
        build_sharded_teacher_model,
        build_teacher_model,
        teacher_dtype,
    )

    dtype = teacher_dtype(env.device)
    teacher = open_teacher(spec, tokenizer="none")
    try:
        if mode == "fsdp":
            model = build_sharded_teacher_model(teacher, dtype, env.device)
        else:
            model = build_teacher_model(teacher, dtype).to(env.device)
    finally:
        teacher.tensors.close()
    return model.eval().requires_grad_(False)
