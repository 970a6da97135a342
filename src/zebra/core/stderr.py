"""`fd2_to`: file descriptor 2 pointed elsewhere for a block, for what Python's `sys.stderr` does not reach (C
libraries, child processes that inherit it)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def fd2_to(fd: int) -> Iterator[None]:
    """File descriptor 2 is `fd` for the block, and what it was again after it, however the block ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
