"""Tiny real Zebra models for the engine tests (random weights; untied and a wide init so greedy tokens vary)."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest
import torch


@functools.cache
def tiny_model(recipe: str, dtype: torch.dtype = torch.float64, seed: int = 0, context: int | None = None):
    """`context`: the config's max_position_embeddings in place of the recipe's (the same weights)."""
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    torch.manual_seed(seed)
    extra = {} if context is None else {"max_position_embeddings": context}
    config = load_recipe(recipe).model.to_config(
        tie_word_embeddings=False, initializer_range=0.2, kernel_backend="torch", **extra
    )
    return ZebraForCausalLM(config).to(dtype).eval()


@pytest.fixture(scope="module")
def hybrid():
    """The tiny hybrid `*-M-G-K-`: one sublayer of every mixer kind (float64)."""
    return tiny_model("tiny")


def greedy_by_full_forwards(model, prompt: list[int], n: int) -> list[int]:
    """The reference: n greedy tokens, each from a full forward over the whole sequence (no cache)."""
    return list(_greedy(model, tuple(prompt), n))


@functools.cache
def _greedy(model, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1]
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return tuple(ids[0, len(prompt) :].tolist())


def trained_tiny_run(base: Path) -> Path:
    """A run of `zebra train tiny` for a few small steps (byte tokenizer, bundled corpus), made once per session.

    Returns the run directory; its `export/` is the HF export the trainer writes. Every test directory that needs
    a trained model shares it through pytest's session temp folder.
    """
    run = base / "runs" / "tiny"
    if (run / "export" / "config.json").is_file():
        return run
    overrides = {
        "train.global_batch_size": 4,
        "train.micro_batch_size": 4,
        "data.seq_len": 64,
        "train.warmup_steps": 4,
        "train.eval_interval": 40,
        "train.save_interval": 40,
    }
    args = ["train", "tiny", "--max-steps", "40", "--yes", "--output", str(base / "runs")]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    # in this process (the CLI exactly as a shell runs it, less a second torch import of ~10 s on 2 cores)
    from typer.testing import CliRunner

    from zebra.cli.main import app

    environ = dict(os.environ)  # what the command sets for itself (its kernel cache folders) stays with it
    try:
        done = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert done.exit_code == 0, done.output
    return run


def tiny_export(base: Path) -> Path:
    """A tiny Zebra HF export with random weights (wide init, so greedy text varies), made once per session."""
    from zebra.convert import export_hf

    export = base / "random-export"
    if (export / "config.json").is_file():
        return export
    model = tiny_model("tiny", dtype=torch.float32, seed=0)
    export_hf(model.state_dict(), model.config, export, tokenizer="byte")
    return export


def without_tokenizer(export: Path, dest: Path) -> Path:
    """A copy of EXPORT without its tokenizer files, as `zebra convert` writes one when the source names none."""
    shutil.copytree(export, dest, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json"))
    return dest
