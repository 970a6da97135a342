"""The one exception type for mistakes a user can fix.

A `ZebraError` carries a one-line message naming the file, key or flag at fault and, where known, the fix.
The CLI prints it as a single line (no traceback) and exits with `exit_code`.
"""

from __future__ import annotations


class ZebraError(Exception):
    """A user-facing error: `message` says what is wrong, `fix` says what to do about it."""

    def __init__(self, message: str, *, fix: str | None = None, exit_code: int = 1):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message
