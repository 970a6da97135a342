"""`export_gguf`: write a Zebra checkpoint as one GGUF file that llama.cpp loads (`llama-server -m FILE`).

The llama.cpp architecture follows from the model's mixers (`zebra.convert.gguf_maps`: GDN -> `qwen35`, Mamba2 ->
`granitehybrid`, KDA / NoPE MLA -> `kimi-linear`); what it cannot run exactly is refused before anything is
read or written, in one line naming the recipe field and the value that fits. The tokenizer and chat template
go inside (`zebra.convert.gguf_vocab`). Tensors are streamed: the header and every tensor's name, shape and type
are written first, then each tensor is built from its Zebra tensors, converted and appended, one at a time, to
a temporary `.NAME.tmp-PID` file next to the output that is fsynced and renamed into place at the end (removed
on any error, Ctrl-C or SIGTERM).

Stored types (`--gguf-type`): `f32` (exact), `f16`, `bf16`, and the block quantisations gguf-py 0.19 can write
(`q8_0`, `q5_1`, `q5_0`, `q4_1`, `q4_0`). Only 2-D weight matrices whose rows fill whole blocks are converted;
norms, biases, decay rates, convolutions (llama.cpp's `ssm_conv` reads float32) and 3-D tensors stay float32.
The k-quants (`q6_k`, `q5_k_m`, `q5_k_s`, `q4_k_m`, `q4_k_s`; `q5_k` and `q4_k` are the `_m` forms), which
gguf-py cannot write, are made by llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`, as
`llama-quantize` does) from the float32 file written first under a temporary name: its rules pick each tensor's
type (a matrix whose rows are not a multiple of 256 falls back to a 32-block type, Q5_0 for Q4_K).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from zebra.convert.gguf_maps import (
    GGUF_ARCHS,
    arch_for,
    block_kinds,
    blockers,
    layer_kinds,
    plan,
    zero_tensors,
)
from zebra.convert.gguf_vocab import write_vocab
from zebra.convert.native import pairs_refusal, servable_recipes
from zebra.convert.writer import (
    SPECIAL_TOKEN_IDS,
    load_tokenizer_to_ship,
    process_alive,
    special_token_ids,
    with_chat_template,
)
from zebra.core.atomic import fsync_dir, make_folder, write_error
from zebra.core.cpus import usable_cpus
from zebra.core.errors import ZebraError
from zebra.mixers import MIXERS

WRITTEN_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")  # gguf-py's encoders
# --gguf-type -> llama.cpp's file type name (`LLAMA_FTYPE_MOSTLY_<name>`): made by llama.cpp's quantizer
# (q5_k and q4_k are llama-quantize's aliases of the _m forms)
LLAMA_QUANTIZED = {"q6_k": "Q6_K", "q5_k_m": "Q5_K_M", "q5_k_s": "Q5_K_S", "q4_k_m": "Q4_K_M", "q4_k_s": "Q4_K_S",
                   "q5_k": "Q5_K_M", "q4_k": "Q4_K_M"}  # fmt: skip
GGUF_TYPES = (*WRITTEN_TYPES, *LLAMA_QUANTIZED)
GGUF_MAGIC = b"GGUF"
KEEP_FLOAT32 = ("conv1d", "norm", ".ssm_a", ".ssm_d")  # name parts of tensors that stay float32


def check_gguf_type(gguf_type: str) -> None:
    """A one-line ZebraError for a `--gguf-type` this writer has no encoder for."""
    if gguf_type in WRITTEN_TYPES:
        return
    if gguf_type not in LLAMA_QUANTIZED:
        raise ZebraError(
            f"--gguf-type {gguf_type}: not a type this export writes",
            fix=f"use one of {', '.join(GGUF_TYPES)}",
        )
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise ZebraError(
            f"--gguf-type {gguf_type}: the k-quants are made by llama.cpp's quantizer, and llama-cpp-python "
            "does not import",
            fix="pip install llama-cpp-python (built from source: README.md says how), or use one of "
            f"{', '.join(WRITTEN_TYPES)}",
        ) from None


def gguf_refusal(cfg: Any) -> ZebraError | None:
    """Why the model of `cfg` cannot be written exactly as a GGUF llama.cpp runs (the first reason), or None."""
    mixers = cfg.layer_pattern[0::2]
    if unpaired := pairs_refusal(cfg.layer_pattern, "gguf", "llama.cpp's blocks"):
        return unpaired
    if arch_for(cfg) is None:
        kinds = set(layer_kinds(cfg))
        labels = " + ".join(MIXERS[c].label for c in dict.fromkeys(mixers))
        closest = servable_recipes(kinds)
        return ZebraError(
            f"--to gguf: model.pattern mixes {labels} and no llama.cpp architecture holds that mix "
            f"({', '.join(GGUF_ARCHS)} do not)",
            fix=f"export it with --to hf (trust_remote_code); the closest recipes llama.cpp runs: {closest}",
        )
    found = blockers(cfg)
    if not found:
        return None
    b, arch = found[0], arch_for(cfg).name
    more = f" ({len(found) - 1} more setting(s) block it too)" if len(found) > 1 else ""
    value = str(b.value).lower() if isinstance(b.value, bool) else b.value
    fits = str(b.fits).lower() if isinstance(b.fits, bool) else b.fits
    return ZebraError(
        f"--to gguf: {b.field}: {value} has no exact equivalent in llama.cpp's {arch}: {b.why}{more}",
        fix=f"train with {b.field}: {fits} (or export with --to hf)",
    )


def _writer_class() -> Any:
    import gguf

    class Writer(gguf.GGUFWriter):
        """gguf-py's writer, able to write an empty array (llama.cpp requires `tokenizer.ggml.merges` even when
        the vocabulary has no merges; gguf-py refuses empty arrays)."""

        def _pack_val(self, val: Any, vtype: Any, add_vtype: bool, sub_type: Any = None) -> bytes:
            if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0:
                head = self._pack("I", vtype) if add_vtype else b""
                return head + self._pack("I", sub_type or gguf.GGUFValueType.STRING) + self._pack("Q", 0)
            return super()._pack_val(val, vtype, add_vtype, sub_type)

    return Writer


def stored_type(name: str, shape: tuple[int, ...], gguf_type: str) -> Any:
    """The GGML type tensor `name` of numpy shape `shape` is stored in under `--gguf-type gguf_type`."""
    import gguf

    f32, wanted = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType[gguf_type.upper()]
    if len(shape) != 2 or any(part in name for part in KEEP_FLOAT32):
        return f32
    block = gguf.GGML_QUANT_SIZES[wanted][0]
    return wanted if shape[-1] % block == 0 else f32


def _encode(tensor: Any, qtype: Any) -> Any:
    """`tensor` as the numpy array written for GGML type `qtype` (float32 first: the quantizers read it)."""
    import gguf
    import numpy as np
    import torch

    array = tensor.detach().to(device="cpu", dtype=torch.float32).numpy()
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(array)
    if qtype == gguf.GGMLQuantizationType.F16:
        return array.astype(np.float16)
    return gguf.quants.quantize(array, qtype)


def _tensor_info(writer: Any, name: str, shape: tuple[int, ...], qtype: Any) -> int:
    """Declare tensor `name` to `writer`; returns its size in bytes."""
    import gguf
    import numpy as np

    if qtype == gguf.GGMLQuantizationType.F32:
        nbytes = int(np.prod(shape)) * 4
        writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
    elif qtype == gguf.GGMLQuantizationType.F16:
        nbytes = int(np.prod(shape)) * 2
        writer.add_tensor_info(name, shape, np.dtype(np.float16), nbytes)
    else:
        byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
        nbytes = int(np.prod(byte_shape))
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    return nbytes


def default_gguf_output(src: Path, gguf_type: str) -> Path:
    """`<src>.gguf` next to the source (`<src>-<type>.gguf` for a type other than f32)."""
    base = src.parent / src.stem if src.is_file() else src
    return base.with_name(base.name + ("" if gguf_type == "f32" else f"-{gguf_type}") + ".gguf")


@contextlib.contextmanager
def gguf_file(path: Path, *, force: bool) -> Iterator[Path]:
    """A temporary file next to `path` that replaces it on success and is removed on any error.

    An existing `path` needs `force` and must be a GGUF file (anything else is refused and left as it is).
    """
    path = Path(path).absolute()
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed run
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            stale.unlink(missing_ok=True)
    if path.exists() or path.is_symlink():
        if not force:
            raise ZebraError(f"--output {path} already exists", fix="pass --force to replace it")
        if not path.is_file() or _magic(path) != GGUF_MAGIC:
            raise ZebraError(
                f"--output {path} is not a GGUF file: refusing to replace it (left as it is)",
                fix="choose another --output",
            )
    make_folder(path.parent, fix="choose another --output")
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(path, e, fix="choose another --output") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _magic(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def export_gguf(
    checkpoint: Any,
    output: Path,
    *,
    tokenizer: Any = None,
    gguf_type: str = "f32",
    force: bool = False,
    on_progress: Callable[[float, float | None, str], None] | None = None,
) -> Path:
    """Write `checkpoint` (a `zebra.convert.formats.Checkpoint`) as the GGUF file `output`.

    Raises:
        ZebraError: the model or tokenizer cannot be written exactly (nothing is read or written), an unknown
            `gguf_type`, an existing output without `force`.
    """
    import torch

    from zebra.convert.native_export import NativeSource

    check_gguf_type(gguf_type)
    cfg = checkpoint.config
    if (why := gguf_refusal(cfg)) is not None:
        raise why
    tok = with_chat_template(load_tokenizer_to_ship(tokenizer))
    if tok is None:
        raise ZebraError(
            "--to gguf: no tokenizer (llama.cpp reads its tokenizer from the GGUF file)",
            fix="pass --tokenizer byte or the tokenizer the model was trained with",
        )
    arch = arch_for(cfg)
    source = NativeSource(checkpoint.tensors, plan(cfg, arch, list(checkpoint.tensors.shapes())))
    zeros = dict(zero_tensors(cfg, arch))  # the pass-through block (gguf_maps.PASS)
    shapes = {**{n: shape for n, (shape, _) in source.shapes().items()}, **zeros}
    writer = _writer_class()(None, arch.name)
    ids = special_token_ids({n: getattr(cfg, n, None) for n in SPECIAL_TOKEN_IDS}, tok)
    arch.metadata(cfg, block_kinds(cfg, arch), writer)
    write_vocab(writer, tok, cfg.vocab_size, ids)
    writer.add_name(Path(checkpoint.path).name)
    by_llama = gguf_type in LLAMA_QUANTIZED  # the float32 file first, then llama.cpp's quantizer
    types = {n: stored_type(n, shape, "f32" if by_llama else gguf_type) for n, shape in shapes.items()}
    total = sum(_tensor_info(writer, n, shapes[n], t) for n, t in types.items())
    with gguf_file(Path(output), force=force) as tmp:
        f32 = tmp.with_name(tmp.name.replace(".tmp-", ".tmp-f32-")) if by_llama else tmp  # its own temporary
        try:
            try:
                writer.write_header_to_file(f32)
                writer.write_kv_data_to_file()
                writer.write_ti_data_to_file()
                done = 0
                for name, qtype in types.items():
                    data = _encode(torch.zeros(zeros[name]) if name in zeros else source.get(name), qtype)
                    writer.write_tensor_data(data)
                    done += data.nbytes
                    if on_progress is not None:
                        on_progress(done, total, name)
            finally:
                writer.close()
            if by_llama:
                if on_progress is not None:
                    on_progress(done, total, f"llama.cpp quantizes to {LLAMA_QUANTIZED[gguf_type]}")
                llama_quantize(f32, tmp, LLAMA_QUANTIZED[gguf_type])
        finally:
            if by_llama:
                f32.unlink(missing_ok=True)
    return Path(output)


def llama_quantize(source: Path, output: Path, file_type: str) -> None:
    """llama.cpp's quantizer: the float32 GGUF `source` as `output` of `LLAMA_FTYPE_MOSTLY_<file_type>`.

    llama.cpp logs every tensor while it works: that goes to a temporary file, and its last lines are the error's
    words when it fails. Every level is let through for the call: llama-cpp-python's log callback takes ggml's
    error level for debug and drops it once a `Llama(verbose=False)` has run."""
    import logging
    import tempfile

    import llama_cpp

    from zebra.core.stderr import fd2_to

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = usable_cpus()
    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    with tempfile.TemporaryFile("w+") as log:
        logger.setLevel(logging.DEBUG)
        try:
            with fd2_to(log.fileno()), contextlib.redirect_stderr(log):  # C's stderr, and the callback's
                status = llama_cpp.llama_model_quantize(str(source).encode(), str(output).encode(), params)
        finally:
            logger.setLevel(level)
        log.seek(0)
        last = " ".join(line.strip() for line in log.read().splitlines()[-2:])
    if status != 0:
        raise ZebraError(
            f"--gguf-type {file_type.lower()}: llama.cpp's quantizer failed ({last or f'status {status}'})",
            fix="write the float32 file (--gguf-type f32) and run llama-quantize on it to see why",
        )
