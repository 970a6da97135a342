"""Run `zebra` as a user would: in-process through Typer's CliRunner, or as a real subprocess (no TTY)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app

ENTRY = "import sys; sys.argv[0] = 'zebra'; from zebra.cli.main import main; main()"


@pytest.fixture
def cli():
    """cli("recipes", "list") -> click Result (exit_code, stdout, stderr, output)."""
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None):
        return runner.invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})

    return invoke


@pytest.fixture
def zebra():
    """zebra("--version") -> CompletedProcess of a fresh `zebra` process with stdin closed (not a TTY)."""

    def run(*args: str, env: dict[str, str] | None = None, cwd=None):
        return subprocess.run(
            [sys.executable, "-c", ENTRY, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=cwd,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
        )

    return run
