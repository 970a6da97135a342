"""A tiny trained Zebra model and the local task YAMLs (data paths made absolute) for the eval tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tests.generation.conftest import trained_tiny_run

TASKS = Path(__file__).parent / "tasks"


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A tiny model trained by `zebra train` (the run directory)."""
    return trained_tiny_run(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def export(run_dir) -> Path:
    return run_dir / "export"


@pytest.fixture(scope="session")
def task_dir(tmp_path_factory) -> Path:
    """tests/eval/tasks with each `data_files` path absolute (lm-eval resolves them from the current folder)."""
    out = tmp_path_factory.mktemp("tasks")
    for src in TASKS.glob("*.yaml"):
        spec = yaml.safe_load(src.read_text())
        files = spec["dataset_kwargs"]["data_files"]
        spec["dataset_kwargs"]["data_files"] = {
            split: str((TASKS / f).resolve()) for split, f in files.items()
        }
        (out / src.name).write_text(yaml.safe_dump(spec))
    return out
