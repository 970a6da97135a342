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


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("zebra.models.modeling_zebra", "zebra.train.trainer"),  # the model under the trainer
        ("zebra_kernels.backend", "zebra.core.errors"),  # the kernels import nothing of zebra, not even core
        ("zebra.core.errors", "zebra.core.host_copy"),  # inside core: errors at the bottom
    ],
)
def test_a_forbidden_import_breaks_a_contract(tmp_path, importer, imported):
    """The contracts see a forbidden edge: a copy of the tree where `importer` imports `imported` fails."""
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    root = "kernels" if importer.startswith("zebra_kernels") else "src"
    module = tmp_path / root / (importer.replace(".", "/") + ".py")
    module.write_text(f"import {imported}  # noqa\n" + module.read_text())
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert f"{importer} -> {imported}" in result.stdout
