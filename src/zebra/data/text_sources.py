"""Text sources for `zebra data prep`: a Hugging Face Hub dataset (streamed) or local jsonl / json / parquet /
arrow files, among them FineWeb-Edu's samples (`--sample 10BT`: its `sample-10BT` config), or plain text files
(`.txt`, `.txt.gz`), each file one document.

A source is read in a fixed order as *rows* (one document per row, row 0 first) and yields `RawBatch`es:
raw payloads (jsonl lines, Arrow arrays, or hub texts) that worker processes decode with `decode_texts`.
Row numbers are the unit of resumable work: the same source always yields the same rows in the same order.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import itertools
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from zebra.core.errors import ZebraError, first_line, reading

FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"
DEFAULT_TOKENIZER = "meta-llama/Llama-3.2-1B"  # prep's default, and the guide's 1B recipes' tokenizer
FINEWEB_SAMPLES = {
    "10BT": "sample-10BT",
    "100BT": "sample-100BT",
    "350BT": "sample-350BT",
}  # --sample: config
_FINEWEB_SAMPLE_TOKENS = {"10BT": 10e9, "100BT": 100e9, "350BT": 350e9}
# Plain text: one document per file. Markdown is not read, so a dataset's README.md does not become a document.
TEXT_SUFFIXES = (".txt", ".txt.gz")
LOCAL_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet", ".arrow", *TEXT_SUFFIXES)
MAX_TEXT_FILE_BYTES = 64 << 20  # a plain text file is one document: a larger one is most likely many
TEXT_BATCH_BYTES = 16 << 20  # plain text files read into one batch at most (on disk; one file always fits)
HUB_CONNECT_TIMEOUT = 5.0  # seconds for the one reachability probe
_EDGE = 1 << 20  # a local file's fingerprint hashes its first and last MiB

# Row status codes returned by `decode_texts` (one per row).
OK, EMPTY, NON_UTF8, MISSING_FIELD, MALFORMED = 0, 1, 2, 3, 4
STATUS_NAMES = {EMPTY: "empty", NON_UTF8: "non_utf8", MISSING_FIELD: "missing_field", MALFORMED: "malformed"}


@dataclass(frozen=True)
class RawBatch:
    """Rows `[start, start + len(payload))` of a source, not yet decoded.

    `kind` says how to decode `payload`: `jsonl` (list of line bytes), `arrow` (a pyarrow string/binary
    array of the text column) or `texts` (list of str / None).
    """

    start: int
    kind: str
    payload: Any
    text_field: str

    def __len__(self) -> int:
        return len(self.payload)

    def slice(self, lo: int, hi: int) -> RawBatch:
        """Rows `[start + lo, start + hi)`."""
        return RawBatch(self.start + lo, self.kind, self.payload[lo:hi], self.text_field)


@dataclass
class Source:
    """Where documents come from, described well enough to be recorded in a manifest and re-opened.

    `pin` fixes what it reads before a prep starts: a hub dataset's commit (`revision`), or each local file's
    size and a hash of its first and last MiB (`fingerprints`), so a resumed prep reads the same rows.
    """

    kind: str  # "hub" | "local"
    name: str  # hub id, or the --source argument as given
    text_field: str = "text"
    config: str | None = None
    split: str = "train"
    files: list[Path] = field(default_factory=list)
    revision: str | None = None  # hub: the dataset repository's commit sha (after `pin`)
    fingerprints: list[dict[str, Any]] | None = None  # local: one per file (after `pin`)

    def describe(self) -> dict:
        """The manifest's `source` entry."""
        d: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.kind == "hub":
            d |= {"config": self.config, "split": self.split, "revision": self.revision}
        else:
            d |= {"files": [str(f) for f in self.files], "fingerprints": self.fingerprints}
        return d

    def pin(self, recorded: dict[str, Any] | None = None) -> None:
        """Fix what this source reads: the hub dataset's commit (the one `recorded`, an earlier run's manifest
        entry for the same dataset, names; else the current one), or the local files' fingerprints.

        Raises:
            ZebraError: the Hub is unreachable, or has no such dataset.
        """
        if self.kind == "local":
            self.fingerprints = [file_fingerprint(f) for f in self.files]
            return
        earlier = recorded or {}
        same = {k: earlier.get(k) for k in ("kind", "name", "config", "split")} == {
            "kind": "hub",
            "name": self.name,
            "config": self.config,
            "split": self.split,
        }
        self.revision = earlier.get("revision") if same and earlier.get("revision") else _hub_revision(self)

    def count_rows(self) -> int | None:
        """Number of rows when it is cheap to know (local files; hub metadata when present), else None."""
        if self.kind == "hub":
            return _hub_rows(self)
        return sum(_count_file_rows(path) for path in self.files)

    def batches(self, start_row: int = 0, batch_rows: int = 512) -> Iterator[RawBatch]:
        """Yield the rows from `start_row` on, at most `batch_rows` per batch, in source order."""
        if self.kind == "hub":
            yield from _hub_batches(self, start_row, batch_rows)
            return
        row = 0
        for is_text, run in itertools.groupby(self.files, key=lambda p: p.name.endswith(TEXT_SUFFIXES)):
            if is_text:  # one row per file: many files a batch, and none that start_row has passed is read
                files = list(run)
                done = min(max(0, start_row - row), len(files))
                for chunk in _text_file_chunks(files[done:], batch_rows):
                    yield RawBatch(row + done, "texts", [_read_text(p) for p in chunk], self.text_field)
                    done += len(chunk)
                row += len(files)
                continue
            for path in run:
                for batch in _file_batches(path, self.text_field, batch_rows):
                    n = len(batch)
                    if row + n > start_row:
                        lo = max(0, start_row - row)
                        yield RawBatch(row + lo, batch.kind, batch.payload[lo:], self.text_field)
                    row += n


def open_source(
    source: str, *, text_field: str = "text", config: str | None = None, split: str = "train"
) -> Source:
    """Resolve `--source`: an existing local file or folder, else a hub dataset id (`owner/name`).

    Raises:
        ZebraError: no such path and not a hub id; a folder without supported files; the text field missing.
    """
    path = Path(source).expanduser()
    if path.exists():
        files = _local_files(path)
        if not files:
            raise ZebraError(
                f"--source {source}: no {'/'.join(s.lstrip('.') for s in LOCAL_SUFFIXES)} files found",
                fix="point --source at data files or a folder holding them",
            )
        # absolute, but through its links: a file is read as its own name says (a `doc.txt` link to a blob)
        files = [Path(os.path.abspath(f)) for f in files]
        src = Source("local", str(path.resolve()), text_field, files=files)
        _check_text_files(src.files)
        _check_local_field(src)
        return src
    if (
        source.count("/") == 1
        and not source.startswith((".", "/", "~"))
        and not source.endswith(LOCAL_SUFFIXES)
    ):
        return Source("hub", source, text_field, config=config, split=split)
    raise ZebraError(
        f"--source {source}: no such file or folder", fix="check the path, or pass a hub id owner/name"
    )


def fineweb_sample_source(sample: str) -> Source:
    """FineWeb-Edu sample `10BT` / `100BT` / `350BT` on the Hub."""
    if sample not in FINEWEB_SAMPLES:
        raise ZebraError(f"--sample {sample}: unknown", fix=f"use one of {', '.join(FINEWEB_SAMPLES)}")
    return Source("hub", FINEWEB_EDU, "text", config=FINEWEB_SAMPLES[sample], split="train")


def sample_folder(sample: str, tokenizer: str = DEFAULT_TOKENIZER) -> Path:
    """Where `zebra data prep --sample SAMPLE --tokenizer TOKENIZER` writes by default: `data/fineweb-edu-10BT`
    for the default tokenizer, else with the tokenizer's name after it (`data/fineweb-edu-10BT-gla-1.3B-100B`),
    so data of two tokenizers never meets in one folder. The guide's recipes name these folders."""
    name = f"fineweb-edu-{sample}"
    if tokenizer != DEFAULT_TOKENIZER:
        name += "-" + (Path(tokenizer.rstrip("/")).name or "tokenizer")
    return Path("data") / name


def default_folder(source: str) -> Path:
    """Where `zebra data prep --source SOURCE` writes without `--output`: `data/` and the source's last name
    without its data suffixes (`corpus/docs.jsonl.gz` -> `data/docs`, `owner/name` -> `data/name`)."""
    name = Path(source.rstrip("/")).name
    for suffix in (".gz", ".jsonl", ".json", ".parquet", ".arrow", ".txt"):
        name = name.removesuffix(suffix)
    return Path("data") / (name or "data")


def prep_command(target: str | Path, tokenizer: str) -> str:
    """The `zebra data prep` command that writes the data folder `target` with `tokenizer`: the FineWeb-Edu
    sample whose default folder it is (`--output` only when it lies elsewhere), else a local corpus."""
    import shlex

    target = Path(target)
    tok_flag = "" if tokenizer == DEFAULT_TOKENIZER else f" --tokenizer {shlex.quote(tokenizer)}"
    for sample in FINEWEB_SAMPLES:
        default = sample_folder(sample, tokenizer)
        if target.name == default.name:
            out_flag = "" if target == default else f" --output {shlex.quote(str(target))}"
            return f"zebra data prep --sample {sample}{tok_flag}{out_flag}"
    return f"zebra data prep --source CORPUS --tokenizer {shlex.quote(tokenizer)} --output {shlex.quote(str(target))}"


def fineweb_sample_tokens(sample: str) -> float:
    """The tokens a FineWeb-Edu sample holds by its name (`10BT`: 10e9), for the disk-space check."""
    return _FINEWEB_SAMPLE_TOKENS[sample]


def decode_texts(batch: RawBatch) -> tuple[list[str], list[int], list[int]]:
    """Decode a batch into its valid texts, one status code per row (`OK`, `EMPTY`, ...) and each text's UTF-8 size.

    Runs in worker processes. A row is skipped (and counted) when it is empty or whitespace only, not valid
    UTF-8, lacks the text field, or is not a JSON object.
    """
    if batch.kind == "jsonl":
        values = [_json_value(line, batch.text_field) for line in batch.payload]
    elif batch.kind == "arrow":
        values = batch.payload.to_pylist()
    else:
        values = batch.payload
    texts, status, sizes = [], [], []
    for value in values:
        code, text, size = _check_text(value)
        status.append(code)
        if code == OK:
            texts.append(text)
            sizes.append(size)
    return texts, status, sizes


class _Unusable:
    """A row that carries no text, with its status code; module-level so it pickles to workers."""

    def __init__(self, code: int) -> None:
        self.code = code


_MISSING, _BAD_JSON, _BAD_UTF8 = _Unusable(MISSING_FIELD), _Unusable(MALFORMED), _Unusable(NON_UTF8)


def _json_value(line: bytes, key: str) -> Any:
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        return _BAD_UTF8
    except ValueError:
        return _BAD_JSON if line.strip() else ""
    if not isinstance(record, dict):
        return _BAD_JSON
    return record.get(key, _MISSING)


def _check_text(value: Any) -> tuple[int, str, int]:
    """(status, text, UTF-8 size) of one row's value."""
    if isinstance(value, _Unusable):
        return value.code, "", 0
    if value is None:
        return EMPTY, "", 0
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return NON_UTF8, "", 0
    if not isinstance(value, str):
        return MALFORMED, "", 0
    if not value or value.isspace():
        return EMPTY, "", 0
    try:
        size = len(value.encode("utf-8"))  # lone surrogates (e.g. "\ud800" in JSON) are not UTF-8
    except UnicodeEncodeError:
        return NON_UTF8, "", 0
    return OK, value, size


# --- local files ---------------------------------------------------------------------------------------


def _expected(path: Path) -> str:
    """What a source file should be, for the one line that says it is not (`zebra.core.errors.reading`)."""
    name = path.name.removesuffix(".gz")
    kind = next((k for suffix, k in _KINDS.items() if name.endswith(suffix)), "a data file")
    return f"{kind}, gzip-compressed" if path.name.endswith(".gz") else kind


_KINDS = {".parquet": "a parquet file", ".arrow": "an Arrow file", ".jsonl": "JSON lines", ".json": "JSON",
          ".txt": "a text file"}  # fmt: skip


def _local_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path] if path.name.endswith(LOCAL_SUFFIXES) else []
    if (path / "dataset_dict.json").exists() and (path / "train").is_dir():
        path = path / "train"  # a DatasetDict saved with save_to_disk: its train split
    state = path / "state.json"
    if state.exists():  # a Dataset saved with save_to_disk: its data files, in order
        with reading(state, what="a datasets state.json"):
            names = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        return [path / n for n in names]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(LOCAL_SUFFIXES))


def holds_text(path: Path) -> bool:
    """Whether `path` is a file or folder `zebra data prep --source` reads (jsonl, parquet, .txt, ...)."""
    return bool(_local_files(path))


def file_fingerprint(path: Path) -> dict[str, Any]:
    """`{"bytes": size, "edges_sha256": sha256 of the first and last MiB}`: cheap, and it changes when the file
    is replaced, grown, cut or edited near either end (a copy keeps it; an mtime would not)."""
    with reading(path, what=_expected(path)):
        size = path.stat().st_size
        h = hashlib.sha256()
        with open(path, "rb") as f:
            h.update(f.read(_EDGE))
            if size > _EDGE:
                f.seek(max(_EDGE, size - _EDGE))
                h.update(f.read())
        return {"bytes": size, "edges_sha256": h.hexdigest()}


def _is_json_array(path: Path) -> bool:
    with reading(path, what=_expected(path)):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            head = f.read(4096).lstrip()
        return head.startswith(b"[")


def _text_file_chunks(files: list[Path], batch_rows: int) -> Iterator[list[Path]]:
    """`files` in order, cut into lists of at most `batch_rows` files and TEXT_BATCH_BYTES (at least one file)."""
    chunk: list[Path] = []
    size = 0
    for path in files:
        file_size = path.stat().st_size
        if chunk and (len(chunk) == batch_rows or size + file_size > TEXT_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(path)
        size += file_size
    if chunk:
        yield chunk


def _read_text(path: Path) -> bytes:
    """A plain text file's bytes: the document (decode_texts checks its UTF-8)."""
    with reading(path, what=_expected(path)):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            return f.read()


def _file_batches(path: Path, text_field: str, batch_rows: int) -> Iterator[RawBatch]:
    with reading(path, what=_expected(path)):
        name = path.name
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            with pq.ParquetFile(path) as f:
                for rb in f.iter_batches(batch_size=batch_rows, columns=[text_field]):
                    yield RawBatch(0, "arrow", rb.column(0), text_field)
        elif name.endswith(".arrow"):
            for rb in arrow_batches(path):
                for lo in range(0, rb.num_rows, batch_rows):
                    yield RawBatch(0, "arrow", rb.column(text_field).slice(lo, batch_rows), text_field)
        elif _is_json_array(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                records = json.load(f)
            values = [r.get(text_field, _MISSING) if isinstance(r, dict) else _BAD_JSON for r in records]
            for lo in range(0, len(values), batch_rows):
                yield RawBatch(0, "texts", values[lo : lo + batch_rows], text_field)
        else:
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                lines: list[bytes] = []
                for line in f:
                    lines.append(line)
                    if len(lines) == batch_rows:
                        yield RawBatch(0, "jsonl", lines, text_field)
                        lines = []
                if lines:
                    yield RawBatch(0, "jsonl", lines, text_field)


def arrow_batches(path: Path) -> Iterator[Any]:
    """Record batches of an Arrow IPC stream (what `datasets.save_to_disk` writes) or file."""
    with reading(path, what=_expected(path)):
        import pyarrow as pa

        source = pa.memory_map(str(path))
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
            return
        yield from reader


def _count_file_rows(path: Path) -> int:
    """Rows in one file: parquet/arrow metadata, JSON array length, or lines (a pass over the bytes)."""
    with reading(path, what=_expected(path)):
        name = path.name
        if name.endswith(TEXT_SUFFIXES):
            return 1
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        if name.endswith(".arrow"):
            return sum(rb.num_rows for rb in arrow_batches(path))
        opener = gzip.open if name.endswith(".gz") else open
        if _is_json_array(path):
            with opener(path, "rb") as f:
                return len(json.load(f))
        lines, last = 0, b"\n"
        with opener(path, "rb") as f:
            while chunk := f.read(1 << 22):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        return lines + (last != b"\n")


def _check_text_files(files: list[Path]) -> None:
    """Refuse a plain text file too large to be one document (64 MiB; a corpus dump in one file)."""
    for path in files:
        if path.name.endswith(".txt") and path.stat().st_size > MAX_TEXT_FILE_BYTES:
            raise ZebraError(
                f"--source {path}: a .txt file is one document, and this one holds "
                f"{path.stat().st_size / 2**20:,.0f} MiB",
                fix="split it into one file per document, or write one JSON object per document to a .jsonl file",
            )


def _check_local_field(src: Source) -> None:
    """The text field must exist in the first file (its schema, or its first JSON record); a plain text file
    has none."""
    with reading(src.files[0], what=_expected(src.files[0])):
        path = src.files[0]
        if path.name.endswith(TEXT_SUFFIXES):
            return
        if path.name.endswith(".parquet"):
            import pyarrow.parquet as pq

            names = pq.ParquetFile(path).schema_arrow.names
        elif path.name.endswith(".arrow"):
            names = next(iter(arrow_batches(path))).schema.names
        else:
            record = _first_json_record(path)
            if not isinstance(record, dict):
                return  # an empty file, or malformed rows: counted and reported, not fatal
            names = list(record)
        if src.text_field not in names:
            raise ZebraError(
                f"--text-field {src.text_field}: not in {path.name} (fields: {', '.join(names[:12])})",
                fix="pass --text-field with one of those fields",
            )


def _first_json_record(path: Path) -> Any:
    with reading(path, what=_expected(path)):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            if _is_json_array(path):
                records = json.load(f)
                return records[0] if records else None
            for line in f:
                if line.strip():
                    try:
                        return json.loads(line)
                    except ValueError:
                        return None
        return None


# --- Hugging Face Hub ----------------------------------------------------------------------------------


def _hub_error(src: Source, error: BaseException | None = None) -> ZebraError:
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    why = "HF_HUB_OFFLINE is set" if offline else "no network"
    if error is not None and not offline and "gated" in str(error).lower():
        return ZebraError(
            f"{src.name} on the Hugging Face Hub is gated and access was refused",
            fix="accept its terms on huggingface.co and set HF_TOKEN",
        )
    what = f"{src.name} {src.config}" if src.config else src.name
    # a --source OWNER/NAME reads as a dataset id because no such local path exists: it may be a mistyped path
    typed = src.name != FINEWEB_EDU and src.config is None and not Path(src.name).exists()
    local = f"; no local file or folder {src.name} either" if typed else ""
    return ZebraError(
        f"cannot reach the Hugging Face Hub for {what} ({why}{local})",
        fix="check the path, or download the data elsewhere and pass local jsonl/json/parquet/arrow files with "
        "--source PATH",
    )


def _hub_reachable() -> bool:
    """False when offline mode is set or no TCP connection to the Hub (or the proxy) opens within a few seconds.

    Asked once per process: the libraries behind it would retry an unreachable Hub for half a minute.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    proxy = next(
        (
            os.environ[v]
            for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
            if os.environ.get(v)
        ),
        None,
    )
    url = urlparse(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return _connects(url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80))


@functools.cache
def _connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT).close()
    except OSError:
        return False
    return True


def _hub_revision(src: Source) -> str:
    """The commit sha of the dataset repository's main branch now."""
    if not _hub_reachable():
        raise _hub_error(src)
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        return HfApi().dataset_info(src.name).sha
    except RepositoryNotFoundError:
        raise ZebraError(
            f"{src.name}: no such dataset on the Hugging Face Hub", fix="check --source"
        ) from None
    except Exception as e:  # huggingface_hub's HTTP errors, its transport's connection errors
        raise _hub_error(src, e) from None


def _load_hub(src: Source) -> Any:
    if not _hub_reachable():
        raise _hub_error(src)
    import datasets

    try:
        return datasets.load_dataset(
            src.name, name=src.config, split=src.split, streaming=True, revision=src.revision
        )
    except (ConnectionError, OSError) as e:
        raise _hub_error(src, e) from None
    except ValueError as e:  # e.g. unknown config or split
        raise ZebraError(f"{src.name}: {first_line(e)}", fix="check --config / --split") from None


def _hub_rows(src: Source) -> int | None:
    ds = _load_hub(src)
    splits = getattr(ds.info, "splits", None) or {}
    info = splits.get(src.split) if hasattr(splits, "get") else None
    return getattr(info, "num_examples", None) or None


def _hub_batches(src: Source, start_row: int, batch_rows: int) -> Iterator[RawBatch]:
    ds = _load_hub(src)
    if ds.features is not None and src.text_field not in ds.features:
        raise ZebraError(
            f"--text-field {src.text_field}: not in {src.name} (fields: {', '.join(list(ds.features)[:12])})",
            fix="pass --text-field with one of those fields",
        )
    if start_row:
        ds = ds.skip(start_row)
    row = start_row
    try:
        for columns in ds.iter(batch_size=batch_rows):
            texts = columns.get(src.text_field)
            if texts is None:
                texts = [_MISSING] * len(next(iter(columns.values())))
            yield RawBatch(row, "texts", texts, src.text_field)
            row += len(texts)
    except (ConnectionError, OSError) as e:
        raise _hub_error(src, e) from None
