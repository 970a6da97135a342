"""The tree's shape rules (docs/development.md): no function body in src/ or kernels/ over 80 lines.

A function's signature is not counted: Typer commands declare their options there, one parameter per line.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_BODY_LINES = 80


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the function's end."""
    body = function.body
    has_docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    first = body[1] if has_docstring and len(body) > 1 else body[0]
    return function.end_lineno - first.lineno + 1


def long_functions(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = body_lines(node)
                if lines > MAX_BODY_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_rule_sees_a_long_body(tmp_path):
    statements = "\n".join(f"    x{i} = {i}" for i in range(MAX_BODY_LINES + 1))
    (tmp_path / "long.py").write_text(f'def long(\n    a,\n    b,\n):\n    """Doc."""\n{statements}\n')
    (tmp_path / "short.py").write_text("def short():\n" + "\n".join(["    x = 1"] * MAX_BODY_LINES) + "\n")
    assert [line.split(" ")[1] for line in long_functions(tmp_path)] == ["long"]


def test_no_function_body_is_over_80_lines():
    found = long_functions(ROOT / "src") + long_functions(ROOT / "kernels")
    assert not found, "split these functions:\n" + "\n".join(found)
