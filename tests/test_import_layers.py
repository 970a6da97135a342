"""The import rules of docs/architecture.md ("Code layers"), checked by import-linter's contracts in
pyproject.toml: layers, no models/kernels -> train/launch/cli imports, no cycles between sibling modules."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the tree at `tree` (its src/ and kernels/ on the path: grimp does not see editable
    installs' import hooks)."""
    exe = shutil.which("lint-imports") or pytest.fail("lint-imports is missing: pip install -e '.[dev]'")
    path = f"{tree / 'src'}:{tree / 'kernels'}"
    return subprocess.run(
        [exe, "--no-cache"], cwd=tree, capture_output=True, text=True, env={"PYTHONPATH": path}
    )


def test_the_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_a_model_importing_the_trainer_breaks_a_contract(tmp_path):
    """The contracts see a forbidden edge: a copy of the tree where the model imports the trainer fails."""
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    model = tmp_path / "src/zebra/models/modeling_zebra.py"
    model.write_text("import zebra.train.trainer  # noqa\n" + model.read_text())
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "zebra.models.modeling_zebra -> zebra.train.trainer" in result.stdout
