"""Fixtures of the launcher tests: `zebra` as a real process or in this one, each test with its own job
registry (ZEBRA_CACHE)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app


@pytest.fixture
def zebra_env(tmp_path) -> dict[str, str]:
    """The environment of a `zebra` process: this test's job registry, no TensorBoard, wide tables."""
    return {
        **os.environ,
        "ZEBRA_CACHE": str(tmp_path / "cache"),
        "ZEBRA_TENSORBOARD": "0",
        "COLUMNS": "200",
        "HF_HUB_OFFLINE": "1",
    }


@pytest.fixture
def zebra(zebra_env):
    """zebra("train", ...) -> CompletedProcess of a real `zebra` process (stdin closed, not a TTY)."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: int = 600):
        return subprocess.run(
            [sys.executable, "-m", "zebra.cli.main", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**zebra_env, **(env or {})},
        )

    return run


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """cli("train", ...) -> click Result, in this process (for plans and errors: no training)."""
    monkeypatch.setenv("ZEBRA_CACHE", str(tmp_path / "cache"))
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None):
        return runner.invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})

    return invoke
