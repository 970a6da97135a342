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

from zebra.core.errors import ZebraError, first_line, yaml_problem

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
            raise _unknown_task(name, manager)
    objects: list[Any] = []
    for name in names:
        objects.extend(_load_one(name, manager))
    return objects


def _unknown_task(name: str, manager: Any) -> ZebraError:
    """`name` is not in lm-eval's index: a YAML under --include-path that does not parse (the index leaves it out
    without a word) is named with its problem; else close names are suggested."""
    message = f"--tasks {name}: not an lm-eval task, group or tag"
    unreadable = _unreadable_yamls([Path(p) for p in manager.include_path or []], name)
    if unreadable:
        path, problem = unreadable[0]
        more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
        return ZebraError(
            f"{message}; lm-eval left out {path}{more}, which is not a valid task YAML ({problem})",
            fix=f"fix {path} there: lm-eval skips task YAMLs it cannot read",
        )
    close = close_task_names(name, manager.all_tasks)
    return ZebraError(
        message,
        fix=(f"did you mean one of: {', '.join(close)}? " if close else "")
        + "use --tasks zebra for the guide's suite, or --include-path DIR for local task YAMLs",
    )


def _unreadable_yamls(folders: list[Path], name: str) -> list[tuple[Path, str]]:
    """The `*.yaml` files under `folders` (those lm-eval's index reads) that are not a YAML mapping, with why;
    those whose text holds `name` first."""
    import yaml

    found = []
    for path in (p for folder in folders for p in sorted(folder.glob("**/*.yaml"))):
        try:
            spec = read_task_yaml(path)
        except OSError as e:
            found.append((path, e.strerror or first_line(e)))
        except yaml.YAMLError as e:
            found.append((path, yaml_problem_text(e)))
        else:
            if not isinstance(spec, dict):
                found.append((path, f"a {type(spec).__name__}, not a mapping of task keys"))
    return sorted(found, key=lambda item: name.encode() not in _bytes_or_empty(item[0]))


def _bytes_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def read_task_yaml(path: Path) -> Any:
    """A task YAML as lm-eval reads it, its `!function module.name` tags kept as their text.

    Raises:
        yaml.YAMLError: the file does not parse.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    return yaml.load(path.read_bytes(), Loader=Loader)  # a SafeLoader: the file runs no code


def yaml_problem_text(error: Exception) -> str:
    """A YAML parse error in one line: `line N: what` (`zebra.core.errors.yaml_problem`)."""
    line, what = yaml_problem(error)
    return f"line {line}: {what}" if line else what


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
    import jinja2
    import yaml

    try:
        loaded = manager.load([name])
    except yaml.YAMLError as e:
        raise ZebraError(
            f"--tasks {name}: not a valid task YAML ({yaml_problem_text(e)})", fix="fix the YAML at that line"
        ) from None
    except jinja2.TemplateError as e:  # a template rendered on the task's first document
        raise template_error([name], manager, e) from None
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
        path = _task_yaml(name, manager)
        raise ZebraError(
            f"--tasks {name}: cannot build the task ({first_line(e)})",
            fix=f"fix the task YAML{f' {path}' if path else ''}: its keys and values are lm-eval's TaskConfig "
            "fields (lm-eval's docs/task_guide.md lists them)",
        ) from None
    children = {c for kids in loaded["group_map"].values() for c in kids}
    top_groups = [g for n, g in loaded["groups"].items() if n not in children]
    top_tasks = [t for n, t in loaded["tasks"].items() if n not in children]
    return top_groups + top_tasks


def template_error(names: list[str], manager: Any, error: Exception) -> ZebraError:
    """A task's Jinja template that cannot render (a field the documents lack, a syntax error) as one line naming
    the task, its YAML and the key holding the template.

    lm-eval renders the templates when it builds a task (on its first document) and again for every document while
    it evaluates: the task is the one of `names` whose YAML holds the failing template (or the only one).
    """
    import jinja2

    for name in names:
        path = _task_yaml(name, manager)
        key = _template_key(path, error) if path else None
        if key or len(names) == 1:
            break
    else:
        name, path, key = ",".join(names), None, None
    where = f"{key or 'a template'}{f' of {path}' if path and str(path) != name else ''}"
    if isinstance(error, jinja2.UndefinedError):
        return ZebraError(
            f"--tasks {name}: {where} reads a field the documents lack ({first_line(error)})",
            fix="the templates can read only the dataset's own fields: {{question}} reads a document's question",
        )
    return ZebraError(
        f"--tasks {name}: {where} is not a valid Jinja template ({first_line(error)})",
        fix="{{ field }} inserts a document's field; {% ... %} holds logic",
    )


def _task_yaml(name: str, manager: Any) -> Path | None:
    """The YAML file of a `--tasks` entry: the path itself, or where lm-eval's index found the name."""
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    path = getattr(manager.task_index.get(name), "yaml_path", None)
    return Path(path) if isinstance(path, str | Path) else None


def _template_key(path: Path, error: Exception) -> str | None:
    """The top-level key of the task YAML at `path` whose template raised `error`, when one can tell: the one
    naming the undefined variable, or the one that does not parse."""
    import re

    import jinja2
    import jinja2.meta
    import yaml

    try:
        spec = read_task_yaml(path)
    except (OSError, yaml.YAMLError):
        return None
    undefined = re.match(r"'(\w+)' is undefined", str(error))
    env = jinja2.Environment()
    for key, value in spec.items() if isinstance(spec, dict) else ():
        for template in value if isinstance(value, list) else [value]:
            if not isinstance(template, str):
                continue
            try:
                variables = jinja2.meta.find_undeclared_variables(env.parse(template))
            except jinja2.TemplateSyntaxError:
                if isinstance(error, jinja2.TemplateSyntaxError):
                    return key
                continue
            if undefined and undefined[1] in variables:
                return key
    return None


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )
