"""What a launcher writes must stay on its line: recipe keys and flags end up in sbatch's `#SBATCH` lines
(submitit writes one line per parameter) and in the container spec. A control character in any of them, a
newline above all, would end the line and start a shell command of the batch script (a shared recipe's
`launch: {account: "a\\n<cmd>"}`). `check_fields` refuses them once, when the plan is made, naming the key.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterable

from zebra.core.errors import ZebraError
from zebra.launch.environment import EnvVar
from zebra.train.run import TrainRun

# The flag that sets a launch key, named with it in errors.
FLAGS = {
    "image": "--image",
    "mounts": "--mount",
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "time": "--time",
    "sbatch_extra": "--sbatch-extra",
    "env": "--env",
    "secret_env": "--secret-env",
}


def control_character(text: str) -> str | None:
    """The first control character in `text` (newline, carriage return, tab, escape, NUL, ...), else None."""
    return next((c for c in text if unicodedata.category(c) == "Cc"), None)


def check_text(key: str, text: str) -> None:
    """A one-line ZebraError naming `key` when `text` holds a control character."""
    bad = control_character(text)
    if bad is not None:
        raise ZebraError(
            f"{key} {text!r}: holds the control character {bad!r}, which would break a line of the batch "
            "script or the container spec",
            fix=f"remove it from {key}",
        )


def _texts(value: object) -> Iterable[str]:
    items = value if isinstance(value, list) else [value]
    return (item for item in items if isinstance(item, str))


def check_fields(run: TrainRun, env: list[EnvVar]) -> None:
    """Every text of `run` that reaches sbatch or a container (its launch keys, run folder, data and
    tokenizer paths) and every variable handed to the ranks is free of control characters."""
    launch = run.recipe.launch
    for field in dataclasses.fields(launch):
        key = f"launch.{field.name}" + (f" ({FLAGS[field.name]})" if field.name in FLAGS else "")
        for text in _texts(getattr(launch, field.name)):
            check_text(key, text)
    check_text("the run folder (--output / --run)", str(run.run_dir))
    for path in run.recipe.data.paths:
        check_text("data.paths (--data)", str(path))
    check_text("data.tokenizer", run.recipe.data.tokenizer)
    for var in env:
        check_text("an environment variable name", var.name)
        bad = control_character(var.value or "")
        if bad is not None:  # the value itself is not shown: it may be a secret
            raise ZebraError(
                f"environment variable {var.name}: its value holds the control character {bad!r}",
                fix=f"remove it from ${var.name}, or unset {var.name} before launching",
            )
