"""Task selection for `zebra eval`: presets, local YAML tasks, and loading them before the model.

Tasks are lm-eval-harness tasks. A `--tasks` entry is a registered task/group/tag name, a preset
(`zebra`: the Zebra-Llama guide's eight-task suite), or a path to a task YAML. `--include-path` adds a folder of
task YAMLs to lm-eval's index. Tasks (and their datasets) load before the model, so a missing task or a dataset
that needs the network fails in one line before minutes of model loading.
"""

from __future__ import annotations

import difflib
import functools
import os
from pathlib import Path
from typing import Any

from zebra.errors import ZebraError, first_line

# The Zebra-Llama guide's evaluation suite (lm-eval task names).
ZEBRA_SUITE = (
    "arc_easy",
    "arc_challenge",
    "hellaswag",
    "mmlu",
    "openbookqa",
    "piqa",
    "race",
    "winogrande",
)
PRESETS = {"zebra": ZEBRA_SUITE}


def expand_tasks(spec: str) -> list[str]:
    """Split a comma-separated `--tasks` value and expand presets, keeping order and dropping repeats.

    >>> expand_tasks("zebra,lambada_openai")[-2:]
    ['winogrande', 'lambada_openai']
    """
    names: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        for name in PRESETS.get(part, (part,)):
            if name not in names:
                names.append(name)
    if not names:
        raise ZebraError(
            "--tasks is empty", fix="pass task names, e.g. --tasks zebra or --tasks arc_easy,piqa"
        )
    return names


def task_manager(include_path: list[Path] | None = None) -> Any:
    """lm-eval's TaskManager over its built-in tasks plus the `include_path` folders (indexed once per process)."""
    for folder in include_path or []:
        if not folder.is_dir():
            raise ZebraError(f"--include-path {folder}: not a folder", fix="pass a folder of task YAML files")
    return _indexed(tuple(str(p.resolve()) for p in include_path or ()))


@functools.lru_cache(maxsize=4)
def _indexed(include_path: tuple[str, ...]) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(include_path) or None)


def load_tasks(names: list[str], manager: Any) -> list[Any]:
    """Build the lm-eval Task/Group objects for `names` (datasets are read here).

    Returns the top-level objects (a group, not its children) ready for `simple_evaluate(tasks=...)`.

    Raises:
        ZebraError: an unknown task, an unreadable YAML, or a hub dataset with no network.
    """
    for name in names:
        if name.endswith((".yaml", ".yml")) and not Path(name).is_file():
            raise ZebraError(f"--tasks {name}: no such task file", fix="check the path to the task YAML")
    for name in names:
        if not name.endswith((".yaml", ".yml")) and name not in manager.all_tasks:
            close = close_task_names(name, manager.all_tasks)
            raise ZebraError(
                f"--tasks {name}: not an lm-eval task, group or tag",
                fix=(f"did you mean one of: {', '.join(close)}? " if close else "")
                + "use --tasks zebra for the guide's suite, or --include-path DIR for local task YAMLs",
            )
    objects: list[Any] = []
    for name in names:
        objects.extend(_load_one(name, manager))
    return objects


def close_task_names(name: str, known: list[str], limit: int = 5) -> list[str]:
    """Names like `name` for a "did you mean": the closest by spelling (difflib), then those holding it.

    >>> close_task_names("piqaa", ["piqa", "arc_easy", "piqa_ar"])
    ['piqa', 'piqa_ar']
    """
    spelled = difflib.get_close_matches(name.lower(), [t.lower() for t in known], n=limit)
    by_spelling = [t for s in spelled for t in known if t.lower() == s]
    holding = [t for t in known if name.lower() in t.lower()]
    return list(dict.fromkeys(by_spelling + holding))[:limit]


def _load_one(name: str, manager: Any) -> list[Any]:
    try:
        loaded = manager.load([name])
    except ConnectionError as e:
        raise ZebraError(
            f"--tasks {name}: its dataset is not cached and the Hugging Face Hub cannot be reached "
            f"({first_line(e)})",
            fix="run once with network access to cache it (HF_HUB_OFFLINE unset), or use local task YAMLs",
        ) from None
    except FileNotFoundError as e:
        raise ZebraError(
            f"--tasks {name}: a data file is missing ({first_line(e)})",
            fix="data_files paths in a task YAML are relative to the current directory; use absolute paths"
            + (" (offline: HF_HUB_OFFLINE=1)" if _offline() else ""),
        ) from None
    except (KeyError, ValueError, TypeError) as e:
        raise ZebraError(f"--tasks {name}: cannot build the task ({first_line(e)})", fix=None) from None
    children = {c for kids in loaded["group_map"].values() for c in kids}
    top_groups = [g for n, g in loaded["groups"].items() if n not in children]
    top_tasks = [t for n, t in loaded["tasks"].items() if n not in children]
    return top_groups + top_tasks


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )
