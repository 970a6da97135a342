"""Durable replacement of files and folders: what is renamed into place is on the disk first.

A rename is atomic, but without an fsync a crash soon after it can leave the new name pointing at files whose
data never reached the disk (or lose the rename itself). So: write under a temporary name, fsync the data,
rename, then fsync the folder that holds the name. Checkpoints (zebra.train) and conversion outputs
(zebra.convert) both follow it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from zebra.errors import ZebraError

OUTPUT_FIX = "move that file away, or choose another --output"


def make_folder(folder: Path, *, fix: str = OUTPUT_FIX) -> None:
    """`folder` and its parents created, or a one-line ZebraError naming the file in the way (`fix`: what to do)
    or saying why the folder cannot be made."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder)
        raise ZebraError(f"{folder}: cannot be a folder, {blocker} is a file", fix=fix) from None
    except OSError as e:  # no permission, a read-only or special file system (/proc), a full disk
        raise ZebraError(
            f"{folder}: cannot create this folder ({e.strerror})",
            fix="check that you can write there (and that the disk has room), or choose another place",
        ) from None


@contextlib.contextmanager
def sigterm_raises(command: str) -> Iterator[None]:
    """While a command runs, SIGTERM raises a ZebraError (exit status 143) where it lands, so the handlers that
    remove temporary outputs run, as they do for Ctrl-C (the default action killed the process on the spot and
    left them). A second SIGTERM kills as usual. Outside the main thread, or where a handler is set already (the
    trainer's), nothing changes."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise ZebraError(
            f"zebra {command}: terminated (SIGTERM)",
            fix="run it again: nothing half-written was left behind",
            exit_code=143,
        )

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """SIGTERM held back (delivered at the end) for a few steps that must not be split, e.g. two renames."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    except (AttributeError, OSError, ValueError):  # no signal masks here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries (the names created, renamed or removed in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """Flush every file under `root` and every folder, `root` included, to the disk."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def write_atomic(path: str | Path, text: str) -> None:
    """Replace `path` by `text` (UTF-8) so that readers see the old or the new content, never a mix, even after a
    crash. The file gets the umask's permissions, like any file the user creates."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fsync_dir(path.parent)


def save_figure(fig, path: Path, **savefig_kwargs) -> Path:
    """Write a matplotlib figure to the image file `path` (its format from its suffix) under a temporary name,
    then rename it into place; a one-line ZebraError when `path` is a folder. The caller closes the figure."""
    if path.is_dir():
        raise ZebraError(
            f"{path}: is a folder, not an image file", fix=f"name the image, e.g. {path / 'loss.png'}"
        )
    make_folder(path.parent, fix="move that file away, or name another image")
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, **savefig_kwargs)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
