"""A real-text corpus nobody here wrote: the Python 3.11 documentation (Debian's `python3.11-doc`) as plain text.

One document per HTML page (the Sphinx page body, without navigation, scripts or permalink marks; code blocks
keep their line breaks), split into train and held-out sets by page: a page is held out when the SHA-1 of its
relative path falls in the first `heldout_fraction` of the hash range, so the split is the same on every machine
and does not move when pages are added. Pages are visited in a fixed pseudo-random order (a second hash), so
the first `max_docs` of them are a uniform sample and the files hold no long runs of one topic. The JSONL files
feed `zebra data prep --source`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

from zebra.core.errors import ZebraError

PYTHON_DOCS = Path("/usr/share/doc/python3.11/html")
SKIPPED_PAGES = re.compile(
    r"^(genindex.*|py-modindex|search|download|copyright|license|bugs|contents)\.html$"
)
MIN_CHARS = 200  # pages shorter than this are navigation stubs
_BLOCKS = {
    "p",
    "div",
    "section",
    "pre",
    "li",
    "dt",
    "dd",
    "tr",
    "br",
    "table",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
}


class _PageText(HTMLParser):
    """Collects the text of a Sphinx page's `<div role="main">`, one line per block element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._main_depth = 0  # <div>s open inside the main div, itself included (0 = outside it)
        self._skipping: str | None = None  # the tag whose content is dropped: script, style, permalink <a>
        self._pre = 0  # open <pre> elements: whitespace is kept inside them

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div" and (self._main_depth or a.get("role") == "main"):
            self._main_depth += 1
        if not self._main_depth:
            return
        if self._skipping is None and (tag in ("script", "style") or "headerlink" in (a.get("class") or "")):
            self._skipping = tag
        self._pre += tag == "pre"
        if tag in _BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if not self._main_depth:
            return
        if tag == self._skipping:
            self._skipping = None
        if tag == "pre" and self._pre:
            self._pre -= 1
        if tag in _BLOCKS:
            self.parts.append("\n")
        if tag == "div":
            self._main_depth -= 1

    def handle_data(self, data: str) -> None:
        if self._main_depth and self._skipping is None:
            self.parts.append(data if self._pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        lines = (line.rstrip() for line in "".join(self.parts).split("\n"))
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def html_to_text(html: str) -> str:
    """The readable text of one Sphinx HTML page."""
    parser = _PageText()
    parser.feed(html)
    parser.close()
    return parser.text()


def _hash(text: str) -> float:
    """A stable number in [0, 1) for `text`."""
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big") / 2**64


def is_heldout(page: str, heldout_fraction: float) -> bool:
    """Whether the page (its path relative to the docs root) belongs to the held-out set."""
    return _hash(page) < heldout_fraction


def python_docs_pages(root: Path = PYTHON_DOCS) -> Iterator[tuple[str, str]]:
    """(relative path, text) of every content page under `root`, in a fixed pseudo-random order."""
    if not root.is_dir():
        raise ZebraError(
            f"{root}: the Python 3.11 documentation is not installed",
            fix="apt-get install python3.11-doc (Debian/Ubuntu), or pass the folder of its HTML pages",
        )
    for page, path in python_docs_page_files(root):
        text = html_to_text(path.read_text(encoding="utf-8", errors="replace"))
        if len(text) >= MIN_CHARS:
            yield page, text


def python_docs_page_files(root: Path) -> list[tuple[str, Path]]:
    """(relative path, file) of every HTML page under `root` that may hold content (no index, search or
    licence page), in a fixed pseudo-random order."""
    pages = []
    for path in sorted(root.rglob("*.html"), key=lambda p: _hash("order:" + p.relative_to(root).as_posix())):
        page = path.relative_to(root).as_posix()
        if not (page.startswith(("_", "includes/")) or SKIPPED_PAGES.match(page)):
            pages.append((page, path))
    return pages


def write_python_docs_corpus(
    output: str | Path,
    *,
    heldout_fraction: float = 0.1,
    max_docs: int | None = None,
    root: Path = PYTHON_DOCS,
) -> dict[str, int]:
    """Write `output/train.jsonl` and `output/heldout.jsonl` (`{"id": page, "text": ...}` per line).

    Args:
        output: the folder (created if needed).
        heldout_fraction: the share of pages held out (by the hash of their path).
        max_docs: stop after this many pages (both splits together); None = every page (about 490).
        root: the folder of the HTML pages.

    Returns:
        Documents and characters per split: {"train_docs", "train_chars", "heldout_docs", "heldout_chars"}.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ZebraError(f"heldout_fraction {heldout_fraction}: must be between 0 and 1", fix="use e.g. 0.1")
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"train_docs": 0, "train_chars": 0, "heldout_docs": 0, "heldout_chars": 0}
    tmp = {split: out / f".{split}.jsonl.tmp-{os.getpid()}" for split in ("train", "heldout")}
    files = {split: open(path, "w", encoding="utf-8") for split, path in tmp.items()}  # noqa: SIM115
    try:
        for n, (page, text) in enumerate(python_docs_pages(Path(root))):
            if max_docs is not None and n >= max_docs:
                break
            split = "heldout" if is_heldout(page, heldout_fraction) else "train"
            files[split].write(json.dumps({"id": page, "text": text}, ensure_ascii=False) + "\n")
            counts[f"{split}_docs"] += 1
            counts[f"{split}_chars"] += len(text)
    except BaseException:
        for f, path in zip(files.values(), tmp.values(), strict=True):
            f.close()
            path.unlink(missing_ok=True)
        raise
    for f in files.values():
        f.close()
    for split, path in tmp.items():
        path.replace(out / f"{split}.jsonl")
    return counts
