"""Writing an output directory: streaming sharded safetensors, the temp-folder-then-rename directory itself, and
the files every exported model ships next to its weights (generation_config.json, the tokenizer).

Shards are planned from names, shapes and dtypes alone; each shard's header is written first and then every
tensor is fetched, checked and appended in turn, so the writer holds one tensor at a time (never a whole shard,
never the whole model). Files follow the safetensors format (8-byte little-endian header length, JSON header,
raw little-endian data) and, when there is more than one shard, transformers' `model.safetensors.index.json`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zebra.core.atomic import fsync_dir, fsync_tree, make_folder, sigterm_deferred, write_error
from zebra.core.errors import ZebraError
from zebra.data.tokenizers import load_tokenizer
from zebra.folders.model_folder import check_output, check_replaceable

_DTYPE_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
DEFAULT_MAX_SHARD = "5GB"
SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class TensorSpec:
    """What will be written: `name`, `shape` and the on-disk `dtype`."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


def parse_size(size: int | str) -> int:
    """`5GB`, `500MB`, `2GiB` or a byte count -> bytes."""
    if isinstance(size, int):
        return _positive(size, size)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*", size, re.IGNORECASE)
    if not m:
        raise ZebraError(f"--max-shard-size {size}: not a size", fix="use e.g. 5GB, 500MB or a byte count")
    unit = (m.group(2) or "B").upper()
    base = 1024 if "I" in unit else 1000
    power = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[0] if unit != "B" else "B"]
    return _positive(int(float(m.group(1)) * base**power), size)


def _positive(nbytes: int, size: int | str) -> int:
    if nbytes < 1:  # 0 used to write one tensor per shard
        raise ZebraError(f"--max-shard-size {size}: must be at least one byte", fix="use e.g. 5GB or 500MB")
    return nbytes


def stored_dtype(specs: list[TensorSpec]) -> str:
    """The floating dtype holding most bytes (config.json's `dtype`, what `from_pretrained` loads by default)."""
    by_dtype: dict[str, int] = {}
    for spec in specs:
        if spec.dtype.is_floating_point:
            name = str(spec.dtype).removeprefix("torch.")
            by_dtype[name] = by_dtype.get(name, 0) + spec.nbytes
    return max(by_dtype, key=by_dtype.__getitem__) if by_dtype else "float32"


def tensor_specs(
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]],
    cast: torch.dtype | None,
    *,
    skip: Collection[str] = (),
) -> list[TensorSpec]:
    """What to write, in `shapes` order: floating tensors cast to `cast` (None keeps each dtype), `skip` left out."""
    return [
        TensorSpec(name, shape, cast if cast is not None and dt.is_floating_point else dt)
        for name, (shape, dt) in shapes.items()
        if name not in skip
    ]


def plan_shards(specs: list[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Greedy, in order: a new shard starts when the next tensor would push the current one past the limit."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def write_safetensors(
    directory: Path,
    specs: list[TensorSpec],
    fetch: Callable[[str], torch.Tensor],
    *,
    max_shard_bytes: int,
    on_progress: Callable[[float, float | None, str], None] | None = None,
    origin: str = "",
) -> list[str]:
    """Write `specs` as `model.safetensors` (or numbered shards + index), fetching each tensor once, in order.

    Args:
        directory: the (temporary) output directory.
        specs: tensors to write, in writing order; `fetch(name)` must return exactly `shape`, any float dtype
            (cast to `dtype` here).
        max_shard_bytes: shard size limit (a single larger tensor gets a shard of its own).
        on_progress: called after each tensor with (bytes written, total bytes, the tensor's name).
        origin: where the tensors come from, for error messages.

    Returns:
        The file names written.
    """
    shards = plan_shards(specs, max_shard_bytes)
    n = len(shards)
    names = (
        ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    )
    total = sum(s.nbytes for s in specs)
    written = 0

    def on_tensor(spec: TensorSpec) -> None:
        nonlocal written
        written += spec.nbytes
        if on_progress is not None:
            on_progress(written, total, spec.name)

    weight_map: dict[str, str] = {}
    for fname, shard in zip(names, shards, strict=True):
        _write_shard(directory / fname, shard, fetch, on_tensor, origin)
        weight_map.update({s.name: fname for s in shard})
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names


def _write_shard(path, shard, fetch, on_tensor, origin) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in shard:
        header[spec.name] = {
            "dtype": _DTYPE_CODES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for spec in shard:
            tensor = fetch(spec.name)
            if tuple(tensor.shape) != spec.shape:
                raise ZebraError(
                    f"{origin}: {spec.name} has shape {list(tensor.shape)}, its header said {list(spec.shape)}",
                    fix="the checkpoint is inconsistent; use a complete, unmodified checkpoint",
                )
            data = tensor.detach().to(device="cpu", dtype=spec.dtype).contiguous().reshape(-1)
            f.write(memoryview(data.view(torch.uint8).numpy()))
            del data, tensor
            on_tensor(spec)


@contextlib.contextmanager
def output_dir(path: Path, *, force: bool, flag: str = "--output") -> Iterator[Path]:
    """Yield a fresh temporary directory next to `path`; on success it replaces `path`, on error it is removed.

    Before the rename every file and folder of the new output is on the disk, and the rename itself is flushed
    after it (`zebra.core.atomic`), so a crash leaves the old output or the whole new one. An existing `path` needs
    `force`, and must be empty or a model folder (config.json): anything else is refused, never deleted.
    Temporary folders left by killed runs (`.NAME.tmp-PID` of a dead PID) are removed first, and an old output a
    run killed between its two renames set aside (`.NAME.old-PID`) is put back when nothing replaced it (else
    removed), so an interrupted conversion can simply be run again. The output is checked again just before
    the rename: one that another process made meanwhile is not replaced without `force`.
    """
    path = Path(path).absolute()
    _remove_stale_temps(path)
    check_output(path, force=force, flag=flag)
    make_folder(path.parent, fix=f"move that file away, or choose another {flag}")
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as e:  # a read-only or special place (/sys), no permission, a full disk
        raise write_error(path, e, fix=f"choose another {flag}") from None
    try:
        yield tmp
        fsync_tree(tmp)
        if path.exists() and not force:
            raise ZebraError(
                f"{flag} {path}: another process created it while this one was writing (left as it is)",
                fix="pass --force to replace it, or choose another path",
            )
        check_replaceable(path, flag=flag)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.parent / f".{path.name}.old-{os.getpid()}"
    with sigterm_deferred():  # `sigterm_raises` may not land between the two renames
        if path.exists():
            path.rename(old)
        tmp.rename(path)
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temps(path: Path) -> None:
    for stale in path.parent.glob(f".{path.name}.old-*"):  # killed between `path -> old` and `tmp -> path`
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            if path.exists() or path.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.rename(path)  # the old output comes back, as the crash never happened
                fsync_dir(path.parent)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether process `pid` is running (one of another user counts), for a temporary name that carries it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_tokenizer_to_ship(tokenizer: Any) -> Any:
    """The tokenizer an output ships: a name / hub id / folder / `byte` is loaded, a loaded one passes through,
    None or "none" is no tokenizer."""
    if tokenizer is None or tokenizer == "none":
        return None
    if not isinstance(tokenizer, str | Path):
        return tokenizer
    return load_tokenizer(str(tokenizer))


def special_token_ids(ids: Mapping[str, int | None], tok: Any) -> dict[str, int | None]:
    """bos / eos / pad ids: those in `ids`, else the tokenizer's (None where neither has one)."""
    return {n: ids[n] if ids.get(n) is not None else getattr(tok, n, None) for n in SPECIAL_TOKEN_IDS}


def write_generation_config(directory: Path, ids: Mapping[str, int | None]) -> None:
    """generation_config.json with the bos / eos / pad ids."""
    from transformers import GenerationConfig

    GenerationConfig(**{n: ids.get(n) for n in SPECIAL_TOKEN_IDS}).save_pretrained(directory)


def write_model_files(
    directory: Path,
    specs: list[TensorSpec],
    source: Any,
    *,
    max_shard_size: int | str,
    on_progress: Callable[[float, float | None, str], None] | None,
    ids: Mapping[str, int | None],
    tok: Any,
) -> None:
    """What every exporter writes into its temporary `directory` besides its own config: the safetensors of
    `specs` streamed from `source` (a `TensorSource`), generation_config.json with the `ids`, and the tokenizer
    `tok` (none when it is None)."""
    write_safetensors(
        directory,
        specs,
        source.get,
        max_shard_bytes=parse_size(max_shard_size),
        on_progress=on_progress,
        origin=source.origin,
    )
    write_generation_config(directory, ids)
    if tok is not None:
        tok.save_pretrained(directory)


# `zebra chat`'s conversation without a template (zebra.chat.session): the system prompt and a newline, then each
# user message after a newline (none after text that ends in a newline or space), each reply right after it.
PLAIN_CHAT_TEMPLATE = (
    "{%- set ns = namespace(text='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' or ns.text == '' or ns.text.endswith('\\n') or ns.text.endswith(' ') -%}"
    "{%- set piece = m['content'] -%}"
    "{%- else -%}{%- set piece = '\\n' ~ m['content'] -%}{%- endif -%}"
    "{%- if m['role'] == 'system' and ns.text == '' -%}{%- set piece = piece ~ '\\n' -%}{%- endif -%}"
    "{{- piece -}}{%- set ns.text = ns.text ~ piece -%}"
    "{%- endfor -%}"
)


def with_chat_template(tok: Any) -> Any:
    """`tok` with a chat template, so that engines (`vllm serve`, `llama-server`) answer chat requests with the
    text `zebra chat` feeds: its own template when it has one, else `PLAIN_CHAT_TEMPLATE` (opened with the bos
    token when the tokenizer adds one, as `zebra chat` encodes the first turn)."""
    if tok is None or getattr(tok, "chat_template", None):
        return tok
    ids = tok("a", add_special_tokens=True)["input_ids"]
    bos = tok.bos_token if tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id] else None
    tok.chat_template = ("{{- bos_token -}}" if bos else "") + PLAIN_CHAT_TEMPLATE
    return tok
