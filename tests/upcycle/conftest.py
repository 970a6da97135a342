"""Session fixtures: the real SmolLM2-135M-Instruct teacher (read once from its GGUF, kept as HF folders) and
Python-documentation text for held-out losses."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from .teachers import write_hf_folder

warnings.filterwarnings("ignore", message=".*CPU.*")  # FLA warns that its kernels need a GPU


@pytest.fixture(scope="session")
def smollm2_teacher(smollm2_gguf):
    """SmolLM2-135M-Instruct opened from the wheel's GGUF by zebra's GGUF reader (dequantised, float32)."""
    from zebra.upcycle import open_teacher

    teacher = open_teacher(smollm2_gguf)
    yield teacher
    teacher.tensors.close()


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory, smollm2_teacher) -> Path:
    """The whole teacher (30 layers) as an HF Llama folder with its tokenizer."""
    return write_hf_folder(tmp_path_factory.mktemp("teacher") / "smollm2", smollm2_teacher)


@pytest.fixture(scope="session")
def smollm2_4layer_dir(tmp_path_factory, smollm2_teacher) -> Path:
    """The teacher's first 4 layers (with its embeddings, final norm and tokenizer) as an HF Llama folder."""
    return write_hf_folder(tmp_path_factory.mktemp("teacher") / "smollm2-4", smollm2_teacher, num_layers=4)


@pytest.fixture(scope="session")
def python_docs(tmp_path_factory, python_docs_html) -> Path:
    """train.jsonl / heldout.jsonl from 60 pages of the Python documentation (python3.11-doc)."""
    from zebra.data.python_docs import write_python_docs_corpus

    folder = tmp_path_factory.mktemp("python-docs")
    write_python_docs_corpus(folder, heldout_fraction=0.2, max_docs=60, root=python_docs_html)
    return folder


@pytest.fixture(scope="session")
def python_docs_tokens(tmp_path_factory, python_docs, smollm2_4layer_dir) -> Path:
    """The train split tokenized with SmolLM2's tokenizer by `zebra data prep` (Megatron shards + manifest)."""
    from zebra.data.prep import plan_prep, run_prep
    from zebra.data.text_sources import open_source

    folder = tmp_path_factory.mktemp("tokens") / "python-docs"
    plan = plan_prep(
        open_source(str(python_docs / "train.jsonl")), folder, tokenizer=str(smollm2_4layer_dir), workers=1
    )
    run_prep(plan)
    return folder
