"""`convert`: any supported source -> a Zebra HF export, an FLA directory or a transformers-native model
(`zebra.convert.native`); `export_run` for training runs.

The flow is the same for every pair: open the source as a `Checkpoint` (config + lazy tensors under Zebra
names), audit names and shapes against `ZebraForCausalLM` before anything is written, then stream the tensors
into sharded safetensors inside a temporary folder that is renamed into place at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebra.convert import native
from zebra.convert.audit import zebra_audit
from zebra.convert.fla_format import export_fla
from zebra.convert.formats import open_checkpoint
from zebra.convert.gguf_export import check_gguf_type, default_gguf_output, export_gguf, gguf_refusal
from zebra.convert.hf_export import export_hf
from zebra.convert.native_export import export_native
from zebra.convert.writer import DEFAULT_MAX_SHARD
from zebra.core import atomic
from zebra.core.device import resolve_dtype
from zebra.core.errors import ZebraError
from zebra.spec import arch

# transformers' own classes: qwen3-next, qwen3.5, bamba, granite-hybrid, kimi-linear
NATIVE_TARGETS = tuple(native.TARGETS)
TARGETS = ("hf", "fla", "zebra", *NATIVE_TARGETS, "gguf")  # gguf: one file for llama.cpp


@dataclass
class ConvertResult:
    """What `convert` did: where from (`step`: a Zebra run's checkpoint step), what to, how many tensors, and
    notes for the user."""

    source: Path
    source_format: str
    target: str
    output: Path
    tensors: int
    pattern: str
    notes: list[str] = field(default_factory=list)
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}


def default_output(src: Path, to: str, fmt: str, gguf_type: str = "f32") -> Path:
    """`<run>/export` for a training run's Zebra export, else `<src>-hf` / `<src>-fla` / `<src>-<native target>`
    / `<src>.gguf` next to the source."""
    if to == "gguf":
        return default_gguf_output(src, gguf_type)
    if fmt == "zebra" and to in ("hf", "zebra") and (src / "config.yaml").is_file():
        return src / "export"
    base = src.parent / src.stem if src.is_file() else src
    return base.with_name(f"{base.name}-{'hf' if to == 'zebra' else to}")


def check_output_apart(src: str | Path, output: str | Path, to: str, fmt: str) -> None:
    """Refuse an output equal to, inside or containing the source: replacing it would delete what is read.

    The one output inside a source that is allowed is a training run's own `export/` (`default_output`), which
    holds no checkpoint.

    Raises:
        ZebraError: the two paths overlap.
    """
    if fmt == "zebra" and Path(output).resolve() == default_output(Path(src).resolve(), "hf", fmt):
        return
    atomic.check_output_apart(
        output,
        {"the source": src},
        harm="writing it would delete the checkpoint being converted",
        fix=f"choose an output outside {src}, e.g. --output {default_output(Path(src), to, fmt)}",
    )


def convert(
    src: str | Path,
    to: str = "hf",
    output: str | Path | None = None,
    *,
    fmt: str = "auto",
    dtype: str = "auto",
    force: bool = False,
    tokenizer: str | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD,
    gguf_type: str = "f32",
    on_progress: Callable[[float, float | None, str], None] | None = None,
) -> ConvertResult:
    """Convert a checkpoint.

    Args:
        src: a Zebra export / run / checkpoint, an FLA directory or a Primus-Megatron checkpoint.
        to: "hf" (or its alias "zebra"): a Zebra HF export; "fla": FLA's GatedDeltaNet / KDA layout; one of
            `NATIVE_TARGETS`: transformers' own class (refused before anything is written when the model does
            not map exactly: `zebra.convert.native.refusal`).
        output: the output directory (default: see `default_output`).
        fmt: "auto" or the source format (`hf`, `fla`, `zebra`, `megatron`).
        dtype: "auto" (keep), "bf16", "fp16", "fp32" or "fp64" for floating tensors.
        force: replace an existing output.
        tokenizer: tokenizer to ship (name, hub id, directory, `byte`, or "none"); default: the source's.
        max_shard_size: largest safetensors shard.
        gguf_type: the stored type of `--to gguf`'s matrices (`zebra.convert.gguf_export.GGUF_TYPES`).
        on_progress: called after each tensor with (bytes written, total bytes, the tensor's name).
    """
    if to not in TARGETS:
        raise ZebraError(f"--to {to}: unknown target", fix=f"use one of {', '.join(TARGETS)}")
    resolve_dtype(dtype)  # an unknown --dtype or --gguf-type fails before the source is opened
    check_gguf_type(gguf_type)
    ckpt = open_checkpoint(src, fmt)
    src = Path(src)
    out = Path(output) if output is not None else default_output(src, to, ckpt.format, gguf_type)
    check_output_apart(src, out, to, ckpt.format)
    pattern = arch.resolve_pattern(ckpt.config)
    why = native.refusal(ckpt.config, to) if to in NATIVE_TARGETS else None
    if to == "gguf":
        why = gguf_refusal(ckpt.config)
    if why is not None:
        ckpt.tensors.close()
        raise why
    try:
        shapes = {k: s for k, (s, _) in ckpt.tensors.shapes().items()}
        zebra_audit(shapes, ckpt.config).raise_if_failed(str(src))
        tok_name = tokenizer if tokenizer is not None else ckpt.tokenizer
        common = {
            "dtype": dtype,
            "force": force,
            "max_shard_size": max_shard_size,
            "on_progress": on_progress,
        }
        if to == "fla":
            export_fla(ckpt, out, tokenizer=tok_name, **common)
        elif to in NATIVE_TARGETS:
            export_native(ckpt, out, to, tokenizer=tok_name, **common)
        elif to == "gguf":
            export_gguf(
                ckpt, out, tokenizer=tok_name, gguf_type=gguf_type, force=force, on_progress=on_progress
            )
        else:
            export_hf(
                ckpt.tensors,
                ckpt.config,
                out,
                tokenizer=tok_name if tok_name is not None else "none",
                recipe=ckpt.recipe,
                source=f"{src} ({ckpt.format})",
                **common,
            )
    finally:
        ckpt.tensors.close()
    notes = list(ckpt.notes)
    if tok_name is None:
        notes.append(
            "no tokenizer recorded in the source: the output has no tokenizer files (pass --tokenizer)"
        )
    return ConvertResult(src, ckpt.format, to, out, len(shapes), pattern, notes, step=ckpt.step)


def export_run(
    run_dir: str | Path, output: str | Path | None = None, *, force: bool = False, **kwargs: Any
) -> Path:
    """Export a training run's latest checkpoint to `<run>/export` (or `output`) in the Zebra HF layout."""
    return convert(run_dir, "hf", output, fmt="zebra", force=force, **kwargs).output
