"""What a user likely means when a command is given no folder: recent runs and model folders near here.

`zebra chat` with no MODEL looks at `find_models`, `zebra convert` with no SOURCE at `find_runs`.
"""

from __future__ import annotations

import json
from pathlib import Path

from zebra.folders.checkpoint_dir import committed


def find_models(root: Path, *, limit: int = 20) -> list[Path]:
    """Run directories under ROOT/runs and model folders (config.json with a model_type) near ROOT, newest first.

    Looks at ROOT/runs/* (runs: config.yaml + checkpoints/ or export/), ROOT/* and ROOT/*/export.
    """
    found: dict[Path, float] = {}
    candidates = [*_children(root / "runs"), *_children(root)]
    for path in candidates:
        if _is_run(path) or _is_model_dir(path):
            found[path] = path.stat().st_mtime
        export = path / "export"
        if _is_model_dir(export) and not _is_run(path):
            found[export] = export.stat().st_mtime
    return sorted(found, key=lambda p: -found[p])[:limit]


def find_runs(root: Path) -> list[Path]:
    """Training runs under ROOT/runs holding a committed checkpoint, the one with the newest checkpoint first."""
    newest: dict[Path, float] = {}
    for path in _children(root / "runs"):
        found = committed(path / "checkpoints") if (path / "config.yaml").is_file() else []
        if found:
            newest[path] = found[0].stat().st_mtime
    return sorted(newest, key=lambda p: -newest[p])


def _children(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _is_run(path: Path) -> bool:
    return (path / "config.yaml").is_file() and (
        (path / "checkpoints").is_dir() or _is_model_dir(path / "export")
    )


def _is_model_dir(path: Path) -> bool:
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        return bool(json.loads(config.read_text()).get("model_type"))
    except (OSError, ValueError, AttributeError):
        return False
