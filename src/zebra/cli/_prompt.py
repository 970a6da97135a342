"""Interactive choices: asked with questionary on a terminal, never asked with `--yes` or without a TTY."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from zebra.core.errors import ZebraError
from zebra.folders.model_folder import check_replaceable


def can_prompt(yes: bool = False) -> bool:
    """True when a human can answer: stdin and stdout are terminals and neither `--yes` nor ZEBRA_YES is set."""
    if yes or os.environ.get("ZEBRA_YES"):
        return False
    return sys.stdin.isatty() and sys.stdout.isatty()


def choose(message: str, choices: list[str], *, yes: bool, flag: str, default: str | None = None) -> str:
    """Pick one of `choices`; without a terminal, the default or a one-line error naming `flag`."""
    if not can_prompt(yes):
        if default is not None:
            return default
        listed = ", ".join(choices[:16]) + (" ..." if len(choices) > 16 else "")
        raise ZebraError(f"missing {flag}", fix=f"pass {flag} (one of: {listed})")
    import questionary

    answer = questionary.select(message, choices=choices, default=default).ask()
    if answer is None:  # Ctrl-C in the prompt
        raise ZebraError("cancelled", exit_code=130)
    return answer


def choose_found(message: str, found: list[str], *, yes: bool, flag: str, fix: str) -> str:
    """A value for a missing `flag` from `found` (the likeliest first): the only one; of several, the user's pick
    on a terminal, the first with --yes, else a one-line error listing them. None found: an error with `fix`."""
    if not found:
        raise ZebraError(f"missing {flag}", fix=fix)
    if len(found) == 1:
        return found[0]
    if not can_prompt(yes):
        if yes or os.environ.get("ZEBRA_YES"):
            return found[0]
        raise ZebraError(
            f"missing {flag}, and there are {len(found)} candidates",
            fix=f"pass one of: {', '.join(found[:8])}"
            + (" ..." if len(found) > 8 else "")
            + " (or --yes: the first)",
        )
    return choose(message, found, yes=yes, flag=flag, default=found[0])


def confirm(message: str, *, yes: bool, default: bool = False) -> bool:
    """Ask yes/no on a terminal; `--yes` answers yes; with no terminal, answer `default`."""
    if yes or os.environ.get("ZEBRA_YES"):
        return True
    if not can_prompt():
        return default
    import questionary

    answer = questionary.confirm(message, default=default).ask()
    if answer is None:
        raise ZebraError("cancelled", exit_code=130)
    return bool(answer)


def confirm_overwrite(output: Path, *, force: bool, yes: bool) -> bool:
    """Whether an existing `output` (a model folder) may be replaced: `--force`, `--yes`, or asked on a terminal;
    a one-line error otherwise, or when it is not a model folder (`check_replaceable`: never replaced)."""
    if not output.exists():
        return force
    check_replaceable(output)
    if force or confirm(f"{output} exists. Overwrite it?", yes=yes, default=False):
        return True
    raise ZebraError(f"--output {output}: already exists", fix="pass --force (or --yes) to overwrite it")


def ask_text(message: str, *, yes: bool, flag: str, default: str | None = None) -> str:
    """Free-text answer on a terminal; otherwise the default or a one-line error naming `flag`."""
    if not can_prompt(yes):
        if default is not None:
            return default
        raise ZebraError(f"missing {flag}", fix=f"pass {flag}")
    import questionary

    answer = questionary.text(message, default=default or "").ask()
    if answer is None:
        raise ZebraError("cancelled", exit_code=130)
    return answer
