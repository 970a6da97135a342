"""Fixtures of the training tests: a session cache for the tokenized sample corpus, and `cli` (CliRunner)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app


@pytest.fixture(scope="session", autouse=True)
def zebra_cache(tmp_path_factory):
    """One cache (the tokenized sample corpus) for every training test and every process they start."""
    path = tmp_path_factory.getbasetemp() / "zebra-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEBRA_CACHE", str(path))
        mp.setenv("ZEBRA_TENSORBOARD", "0")
        yield path


@pytest.fixture(scope="session")
def sample_prefix(zebra_cache) -> str:
    """The bundled corpus tokenized with the byte tokenizer (a real Megatron .bin/.idx prefix)."""
    from zebra.data import bundled_prefix

    return str(bundled_prefix("byte"))


@pytest.fixture
def cli():
    """cli("train", "tiny", ...) -> click Result; runs in this process like a user's shell would."""
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), env={"COLUMNS": "200"})

    return invoke
