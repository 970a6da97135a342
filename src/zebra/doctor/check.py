"""The result of one doctor check: a name, a status, what was found, and the exact fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One concern of the machine.

    Args:
        name: short stable identifier (`docker`, `gpu`, ...), also what `zebra doctor --require` takes.
        status: `ok`; `warn` (something optional is absent or worth changing); `fail` (zebra will not work).
        detail: what was found, one line; never a secret.
        fix: the command or setting that resolves a warn/fail, or None.
    """

    name: str
    status: Status
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)


def ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def warn(name: str, detail: str, fix: str | None = None) -> Check:
    return Check(name, "warn", detail, fix)


def fail(name: str, detail: str, fix: str | None = None) -> Check:
    return Check(name, "fail", detail, fix)
