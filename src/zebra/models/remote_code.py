"""HF export code: the model library as flat `trust_remote_code` files that need no zebra install.

`write_remote_code(dest_dir)` copies every module the configuration and modeling files import from `zebra` and
`zebra_kernels` (followed transitively, imports inside functions included) into `dest_dir` as flat files, rewrites
those imports to same-folder relative imports (`from .layers_mla import MultiLatentAttention`: transformers'
dynamic-module loader only follows `from .name import ...`), and returns the `auto_map` for config.json.

The mixers' layer classes are imported by dotted path (`zebra.models.layer_classes`), which a flat export cannot
do and transformers cannot follow: the export gets its own `layer_classes.py` that imports the built-in layer
classes of `zebra.mixers.MIXERS` statically from their flat files.

Optional third-party imports (FLA, Triton) that are not already inside a `try` are wrapped in one, because
transformers refuses remote code that imports an uninstalled package anywhere outside `try` blocks; they run only
on the "fla" kernel backend, so the torch fallback works without FLA.

File names: `zebra.models.<a>.<b>` -> `<a>_<b>.py`; any other module -> its dotted name with "_" (e.g.
`zebra_kernels.delta_rule.fla_backend` -> `zebra_kernels_delta_rule_fla_backend.py`, the package `zebra_kernels` -> `zebra_kernels.py`).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

from zebra.core.atomic import write_atomic

ENTRY_MODULES = ("zebra.models.configuration_zebra", "zebra.models.modeling_zebra")
LAYER_CLASSES_MODULE = "zebra.models.layer_classes"  # replaced in the export by `exported_layer_classes()`
AUTO_MAP = {
    "AutoConfig": "configuration_zebra.ZebraConfig",
    "AutoModel": "modeling_zebra.ZebraModel",
    "AutoModelForCausalLM": "modeling_zebra.ZebraForCausalLM",
}
OWN_PACKAGES = ("zebra", "zebra_kernels")
# Packages an export may import unguarded: transformers' loader checks each is installed.
REQUIRED_PACKAGES = frozenset({"torch", "transformers"})


def write_remote_code(dest_dir: str | os.PathLike) -> dict[str, str]:
    """Write the flat modeling/configuration/cache/layer/kernel files into `dest_dir`; return the `auto_map`.

    Args:
        dest_dir: the export folder (created if missing); existing files of the same names are replaced
            atomically (written to a temporary name, then renamed).

    Returns:
        `{"AutoConfig": "configuration_zebra.ZebraConfig", "AutoModel": ..., "AutoModelForCausalLM": ...}`,
        to be stored as `config.auto_map` before `save_pretrained` (or merged into config.json).
    """
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    layer_modules = tuple(sorted({path.rpartition(".")[0] for path in builtin_layers()}))
    for module in module_closure(ENTRY_MODULES + layer_modules):
        text = exported_layer_classes() if module == LAYER_CLASSES_MODULE else rewrite_module(module)
        write_atomic(dest / f"{flat_name(module)}.py", text)
    return dict(AUTO_MAP)


def builtin_layers() -> list[str]:
    """The dotted layer-class paths of the registered mixers that live in our packages (an export can hold those;
    a mixer registered from elsewhere, e.g. a test, is left out)."""
    from zebra.mixers import MIXERS

    return [s.layer for s in MIXERS.values() if s.layer.split(".")[0] in OWN_PACKAGES]


def exported_layer_classes() -> str:
    """The export's `layer_classes.py`: `layer_class(path)` over statically imported built-in layer classes."""
    paths = builtin_layers()
    imports = [f"from .{flat_name(p.rpartition('.')[0])} import {p.rpartition('.')[2]}\n" for p in paths]
    table = "".join(f'    "{p}": {p.rpartition(".")[2]},\n' for p in paths)
    return (
        f"# Written by zebra.models.remote_code.write_remote_code for {LAYER_CLASSES_MODULE}; do not edit.\n"
        '"""The layer class of each built-in mixer, by its dotted path in zebra (imported statically here: this\n'
        'export needs no zebra install)."""\n\n'
        "from __future__ import annotations\n\n"
        + "".join(sorted(imports))
        + f"\nLAYER_CLASSES = {{\n{table}}}\n\n\n"
        "def layer_class(path: str) -> type:\n"
        "    try:\n"
        "        return LAYER_CLASSES[path]\n"
        "    except KeyError:\n"
        '        raise ImportError(f"this export has no mixer layer class {path!r}") from None\n'
    )


def flat_name(module: str) -> str:
    """The flat file stem of a module in the export."""
    prefix = "zebra.models."
    if module.startswith(prefix):
        return module[len(prefix) :].replace(".", "_")
    return module.replace(".", "_")


def module_closure(entries: tuple[str, ...]) -> list[str]:
    """Every `zebra`/`zebra_kernels` module reachable by imports from `entries` (sorted)."""
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        tree = ast.parse(_source_path(module).read_text(encoding="utf-8"))
        todo.extend(target for _, target, _ in _own_imports(module, tree))
    names = sorted(seen)
    stems = [flat_name(m) for m in names]
    if len(set(stems)) != len(stems):
        raise RuntimeError(f"remote code: flat file names collide: {stems}")
    return names


def rewrite_module(module: str) -> str:
    """The module's source with own-package imports made flat-relative and optional imports guarded."""
    text = _source_path(module).read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits: dict[int, tuple[int, str]] = {}  # first line index -> (end line index, replacement)
    for node, target, names in _own_imports(module, tree):
        indent = " " * node.col_offset
        aliases = ", ".join(f"{a.name} as {a.asname}" if a.asname else a.name for a in names)
        edits[node.lineno - 1] = (node.end_lineno, f"{indent}from .{flat_name(target)} import {aliases}\n")
    for node in _unguarded_optional_imports(tree):
        indent = " " * node.col_offset
        original = "".join(lines[node.lineno - 1 : node.end_lineno]).strip()
        package = _top_package(node)
        edits[node.lineno - 1] = (
            node.end_lineno,
            f"{indent}try:\n{indent}    {original}\n{indent}except ImportError as error:\n"
            f'{indent}    raise ImportError("this code path needs the optional package {package!r}") from error\n',
        )
    out, i = [], 0
    while i < len(lines):
        if i in edits:
            end, replacement = edits[i]
            out.append(replacement)
            i = end
        else:
            out.append(lines[i])
            i += 1
    header = f"# Exported from {module} by zebra.models.remote_code.write_remote_code; do not edit.\n"
    return header + "".join(out)


def _source_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise RuntimeError(f"remote code: cannot find the source of {module}")
    return Path(spec.origin)


def _is_package(module: str) -> bool:
    return _source_path(module).name == "__init__.py"


def _own_imports(module: str, tree: ast.Module):
    """(node, target module, aliases) for each import from our packages; unsupported forms raise."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OWN_PACKAGES:
                    raise RuntimeError(
                        f"remote code: {module} line {node.lineno}: use 'from {alias.name} import name' "
                        f"instead of 'import {alias.name}' (flat export)"
                    )
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target.split(".")[0] not in OWN_PACKAGES:
                continue
            _check_single_statement(module, node)
            for alias in node.names:
                if _is_package(target) and importlib.util.find_spec(f"{target}.{alias.name}") is not None:
                    raise RuntimeError(
                        f"remote code: {module} line {node.lineno}: 'from {target} import {alias.name}' imports a "
                        f"module; import names from {target}.{alias.name} instead (flat export)"
                    )
            yield node, target, node.names


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom reads from."""
    if node.level == 0:
        return node.module
    parts = module.split(".")
    package = parts if _is_package(module) else parts[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _check_single_statement(module: str, node: ast.stmt) -> None:
    """Imports are replaced line-wise, so they must not share a line with another statement."""
    line = _source_path(module).read_text(encoding="utf-8").splitlines()[node.lineno - 1]
    if ";" in line.split("#")[0]:
        raise RuntimeError(f"remote code: {module} line {node.lineno}: one import per line, no ';'")


def _top_package(node: ast.Import | ast.ImportFrom) -> str:
    return (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]


def _unguarded_optional_imports(tree: ast.Module) -> list[ast.stmt]:
    """Absolute imports of packages outside the standard library, torch and transformers, not inside `try`."""
    found: list[ast.stmt] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Try):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.ImportFrom) and node.level
        ):
            top = _top_package(node)
            if (
                top not in sys.stdlib_module_names
                and top not in REQUIRED_PACKAGES
                and top not in OWN_PACKAGES
            ):
                found.append(node)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found
