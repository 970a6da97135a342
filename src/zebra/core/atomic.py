"""Durable replacement of files and folders: what is renamed into place is on the disk first.

A rename is atomic, but without an fsync a crash soon after it can leave the new name pointing at files whose
data never reached the disk (or lose the rename itself). So: write under a temporary name, fsync the data,
rename, then fsync the folder that holds the name. Checkpoints (zebra.train) and conversion outputs
(zebra.convert) both follow it. And before anything is written: an output never overlaps what a command reads
(`check_output_apart`), whatever `--force` says.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

from zebra.core.errors import ZebraError

OUTPUT_FIX = "move that file away, or choose another --output"


def overlap(output: str | Path, source: str | Path) -> str | None:
    """How `output` overlaps `source` ("is", "is inside", "contains"), both resolved (symlinks followed), or None."""
    target, read = Path(output).resolve(), Path(source).resolve()
    if target == read:
        return "is"
    if read in target.parents:
        return "is inside"
    if target in read.parents:
        return "contains"
    return None


def check_output_apart(
    output: str | Path,
    inputs: dict[str, str | Path | None] | Iterable[tuple[str, str | Path | None]],
    *,
    flag: str = "--output",
    harm: str = "writing it would destroy what is read",
    fix: str | None = None,
) -> None:
    """Refuse an output that is, lies inside or contains any of a command's inputs (`inputs`: what each is, e.g.
    "the teacher", -> its path; None or a path that does not exist here, such as a hub id, is skipped). Called
    before anything is written, and no flag overrides it: replacing the output would delete what is read.

    Raises:
        ZebraError: naming the flag, the two paths and how they overlap.
    """
    for what, source in inputs.items() if isinstance(inputs, dict) else inputs:
        if source is None or not Path(source).exists():
            continue
        how = overlap(output, source)
        if how is not None:
            raise ZebraError(
                f"{flag} {output} {how} {what} {source}: {harm}",
                fix=fix or f"choose another {flag}, apart from {source} (no flag overrides this)",
            )


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


def write_error(path: str | Path, error: OSError, *, fix: str | None = None) -> ZebraError:
    """A failed write (no permission, a read-only or full disk, a file where a folder should be) as one line
    naming the place; `fix` says where else to write when the place came from a flag or a variable."""
    why = error.strerror or type(error).__name__
    return ZebraError(
        f"cannot write {path}: {why[0].lower() + why[1:]}",
        fix=fix or "free some space, or make it writable, or choose another place",
    )


def check_writable(folder: str | Path, *, fix: str | None = None) -> None:
    """`folder` (created if missing) takes a new file: a probe is written and removed, before long work whose
    result would be lost if it could not be saved (root ignores permission bits, not a read-only mount)."""
    folder = Path(folder)
    make_folder(folder, fix=fix or OUTPUT_FIX)
    _probe(folder, fix)


def check_creatable(path: str | Path, *, fix: str | None = None) -> None:
    """`path`, not made here (a writer renames its output into place at the end), can be made: its nearest
    existing folder takes a new file. Before long work, as `check_writable`."""
    path = Path(path).absolute()
    nearest = next(p for p in path.parents if p.exists())
    if not nearest.is_dir():
        raise ZebraError(f"{path}: cannot be a folder, {nearest} is a file", fix=fix or OUTPUT_FIX)
    _probe(nearest, fix, named=path)


def _probe(folder: Path, fix: str | None, named: Path | None = None) -> None:
    """A file written in `folder` and removed; a failure is a ZebraError naming `named` (default: `folder`)."""
    probe = folder / f".zebra-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
    except OSError as e:
        raise write_error(named or folder, e, fix=fix) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


@contextlib.contextmanager
def output_folder(
    output: str | Path,
    inputs: dict[str, str | Path | None] | Iterable[tuple[str, str | Path | None]],
    *,
    flag: str = "--output",
    harm: str = "writing it would destroy what is read",
    fix: str | None = None,
) -> Iterator[Path]:
    """Before long work, for its whole length: `output` is a folder apart from `inputs` (`check_output_apart`)
    that takes a file (`check_writable`, which creates it), so the work's result is never lost to a bad output;
    when the work fails (an error, an interrupt), the folders made here are removed again if still empty, so a
    failed run leaves no empty results folder behind.

    Raises:
        ZebraError: an overlap, a file in the way, a place that cannot be written.
    """
    output = Path(output)
    check_output_apart(output, inputs, flag=flag, harm=harm)
    made = [p for p in (output, *output.parents) if not p.exists()]  # deepest first
    check_writable(output, fix=fix or f"choose another {flag}")
    try:
        yield output
    except BaseException:
        for folder in made:
            with contextlib.suppress(OSError):  # no longer empty (a result written), or gone
                folder.rmdir()
        raise


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
    crash. The file gets the umask's permissions, like any file the user creates. A write that fails (a full
    disk, a read-only place) leaves the old file and raises a one-line ZebraError naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as e:  # a full disk, a read-only file system, a folder where the file should be
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(path, e) from None
    fsync_dir(path.parent)


def save_figure(fig, path: Path, **savefig_kwargs) -> Path:
    """Write a matplotlib figure to the image file `path` (its format from its suffix) under a temporary name,
    then rename it into place; a one-line ZebraError when `path` is a folder, has no image suffix or cannot be
    written. The caller closes the figure."""
    if path.is_dir():
        raise ZebraError(
            f"{path}: is a folder, not an image file", fix=f"name the image, e.g. {path / 'loss.png'}"
        )
    formats = fig.canvas.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise ZebraError(f"{path}: not an image file name", fix="end it with .png (or .svg, .pdf)")
    make_folder(path.parent, fix="move that file away, or name another image")
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, **savefig_kwargs)
        tmp.replace(path)
    except OSError as e:
        raise write_error(path, e) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path
