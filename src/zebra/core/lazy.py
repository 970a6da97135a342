"""Lazy package exports: a package's public names imported from their modules on first use, so that importing the
package, or one light module of it, does not load the rest (`zebra --help` stays instant)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The module-level `__getattr__` of `package`: `name` read from the module `exports[name]` on first use."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
