"""Models for the chat tests: the tiny model trained by `zebra train`, and a random-weights export."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.generation.conftest import tiny_export, trained_tiny_run


@pytest.fixture(scope="session")
def trained_export(tmp_path_factory) -> Path:
    return trained_tiny_run(tmp_path_factory.getbasetemp()) / "export"


@pytest.fixture(scope="session")
def random_export(tmp_path_factory) -> Path:
    return tiny_export(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def loaded(trained_export):
    """(model, tokenizer) of the trained export, loaded once."""
    from zebra.generation.loading import load_model

    return load_model(trained_export, device="cpu")
