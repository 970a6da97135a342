"""Helpers for writing recipe files in a temporary folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def write(tmp_path: Path):
    """write("name.yaml", "yaml text") -> the file's path (text is dedented)."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    return _write
