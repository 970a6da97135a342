"""Find and load a model for inference: a zebra export, an FLA directory, any HF directory, or a training run.

Every inference command (eval, chat, generate, bench) takes one MODEL argument. `resolve_model_dir` turns it
into a directory that `transformers.AutoModelForCausalLM.from_pretrained` can read, after the model types are
registered with the Auto classes (`import zebra.models` for `zebra`, `import fla` for FLA's types). Nothing here
patches transformers: registration is what makes the local classes win.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zebra.models  # noqa: F401  (registers `zebra` with AutoConfig / AutoModelForCausalLM)
from zebra.convert.pipeline import export_run
from zebra.core.caches import use_kernel_cache
from zebra.core.device import resolve_device, resolve_dtype
from zebra.core.errors import ZebraError, first_line
from zebra.data.tokenizers import has_tokenizer_files, load_tokenizer
from zebra.folders.checkpoint_dir import committed
from zebra.folders.model_folder import config_model_type, model_path
from zebra.generation.engine import Engine
from zebra.mixers import MIXERS

# FLA's whole-model types (fla.models registers these with the Auto classes on `import fla`): those of the mixers
# with an FLA adapter, and FLA's others.
FLA_MODEL_TYPES = {s.fla.model_type for s in MIXERS.values() if s.fla} | {
    *("mamba2", "delta_net", "gsa", "hgrn2", "rwkv7", "mla")
}


@dataclass(frozen=True)
class ModelDir:
    """A loadable HF-layout directory and where it came from.

    Attributes:
        path: the directory holding config.json and the weights.
        model_type: config.json's `model_type` (`zebra`, an FLA type, or any transformers type).
        source: what the user pointed at: `export`, `fla`, `hf` or `run`.
    """

    path: Path
    model_type: str
    source: str

    @property
    def is_fla(self) -> bool:
        return self.model_type in FLA_MODEL_TYPES


def resolve_model_dir(model: str | Path, on_note: Callable[[str], None] | None = None) -> ModelDir:
    """The HF-layout directory behind MODEL (an export, FLA or HF directory, or a run directory).

    A run directory (`config.yaml` + `checkpoints/`) resolves to its `export/`; when that is missing, or older
    than the run's newest checkpoint (the run trained on after it, or is training now), the newest checkpoint is
    exported there first and `on_note` is told.

    Raises:
        ZebraError: MODEL does not exist or is not a model directory.
    """
    path = model_path(model)
    if (path / "config.yaml").is_file() and not (path / "config.json").is_file():
        return _run_export(path, on_note)
    config = path / "config.json"
    if not config.is_file():
        raise ZebraError(
            f"MODEL {model}: no config.json (not a model directory)",
            fix="pass an export directory (config.json + safetensors), an FLA directory or a run directory",
        )
    model_type = read_model_type(path)
    source = "export" if model_type == "zebra" else "fla" if model_type in FLA_MODEL_TYPES else "hf"
    return ModelDir(path=path, model_type=model_type, source=source)


def read_model_type(folder: Path) -> str:
    """`folder/config.json`'s model_type, or a one-line ZebraError."""
    model_type = config_model_type(folder)
    if model_type is None:
        raise ZebraError(
            f"{folder / 'config.json'}: no model_type", fix="re-export the model (zebra convert)"
        )
    return model_type


def _run_export(run: Path, on_note: Callable[[str], None] | None) -> ModelDir:
    export = run / "export"
    exported = (export / "config.json").is_file()
    why = _newer_checkpoint(run, export / "config.json") if exported else "no export yet"
    if why is not None:
        if on_note is not None:
            on_note(f"{run}: exporting its newest checkpoint to {export} ({why})")
        # the newest checkpoint, written atomically through the converter (replacing a stale export)
        export_run(run, export, force=exported)
    model_type = read_model_type(export)
    return ModelDir(path=export, model_type=model_type, source="run")


def _newer_checkpoint(run: Path, config: Path) -> str | None:
    """Why the export whose config.json is `config` is stale: the run's newest checkpoint was committed after it
    was written; None when it is current."""
    found = committed(run / "checkpoints")
    if not found:
        return None
    with contextlib.suppress(OSError):  # pruned meanwhile: a newer one exists, the next load takes it
        if (found[0] / "meta.json").stat().st_mtime > config.stat().st_mtime:
            return f"{found[0].name} is newer than the export"
    return None


def register_model_types(model_dir: ModelDir) -> None:
    """Register FLA's classes with transformers' Auto classes for an FLA directory (`zebra` is registered on
    import of this module)."""
    if model_dir.is_fla:
        try:
            import fla  # noqa: F401  (registers FLA's model types)
        except ImportError:
            raise ZebraError(
                f"MODEL {model_dir.path}: an FLA model ({model_dir.model_type}) but FLA is not installed",
                fix="pip install 'zebra-llama[fla]'",
            ) from None


def machine_kernels(model_dir: ModelDir) -> dict[str, str]:
    """`from_pretrained` keyword arguments that make a Zebra export run this machine's kernels (`auto`), whatever
    backend its config.json names (an export whose writer forced `fla` would not run on a CPU)."""
    return {"kernel_backend": "auto"} if model_dir.model_type == "zebra" else {}


def tokenizer_source(model_dir: ModelDir, tokenizer: str | None = None) -> str:
    """Where MODEL's tokenizer comes from: `tokenizer` (`--tokenizer`: a name, hub id, folder or `byte`) when
    given, else the model folder's own files.

    Raises:
        ZebraError: no `tokenizer` and the folder has no tokenizer files (as an export converted without one).
    """
    if tokenizer is not None:
        return tokenizer
    if not has_tokenizer_files(model_dir.path):
        raise ZebraError(
            f"MODEL {model_dir.path}: no tokenizer files (tokenizer.json, tokenizer_config.json)",
            fix="pass --tokenizer with the model's tokenizer: a hub id (e.g. meta-llama/Llama-3.2-1B), "
            "a folder, or byte",
        )
    return str(model_dir.path)


def load_model(
    model: str | Path,
    *,
    device: str | None = None,
    dtype: str = "auto",
    tokenizer: str | None = None,
    with_tokenizer: bool = True,
    on_note: Callable[[str], None] | None = None,
) -> tuple[Any, Any]:
    """Load MODEL for inference: (model in eval mode on `device`, its tokenizer or None).

    Args:
        model: an export / FLA / HF / run directory (see `resolve_model_dir`).
        device: `cpu`, `cuda`, `cuda:N` or `auto`; default: cuda when available.
        dtype: `auto` (the checkpoint's), `bf16`, `fp16`, `fp32`, `fp64`.
        tokenizer: the tokenizer to use instead of the model's own (see `tokenizer_source`).
        with_tokenizer: also load the tokenizer (a ZebraError when there is none); False returns None for it.
        on_note: told when a run directory's export is written first (`resolve_model_dir`).
    """
    tok = tokenizer if with_tokenizer else False
    return _load(model, device, dtype, auto_on_gpu=None, tokenizer=tok, on_note=on_note)


def load_engine(
    model: str | Path,
    *,
    device: str | None = None,
    dtype: str = "auto",
    tokenizer: str | None = None,
    cuda_graph: bool = True,
    compile: bool = False,
    on_note: Callable[[str], None] | None = None,
) -> tuple[Engine, Any]:
    """MODEL ready to decode (chat, generate): (an `Engine` over it, its tokenizer).

    `dtype` as in `load_model`, except that `auto` is bf16 on a GPU (decoding is bound by reading the weights);
    `tokenizer` and `on_note` as in `load_model`; `cuda_graph` and `compile` as in `Engine`.
    """
    lm, tok = _load(model, device, dtype, auto_on_gpu="bf16", tokenizer=tokenizer, on_note=on_note)
    return Engine(lm, cuda_graph=cuda_graph, compile=compile), tok


def _load(
    model: str | Path,
    device: str | None,
    dtype: str,
    *,
    auto_on_gpu: str | None,
    tokenizer: str | bool | None,
    on_note: Callable[[str], None] | None,
) -> tuple[Any, Any]:
    """`tokenizer`: a name to use, None for the model's own, False for none at all."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-tensor bar for a load that takes seconds is noise

    model_dir = resolve_model_dir(model, on_note)
    register_model_types(model_dir)
    use_kernel_cache()  # compiled kernels and autotuning persist between runs
    tok = None if tokenizer is False else _load_tokenizer(model_dir, tokenizer)  # before seconds of loading
    device = resolve_device(device)
    kwargs: dict[str, Any] = {}
    if (td := resolve_dtype(dtype, device, auto_on_gpu=auto_on_gpu)) is not None:
        kwargs["dtype"] = td
    kwargs.update(machine_kernels(model_dir))
    try:
        with _load_report_held():
            lm = AutoModelForCausalLM.from_pretrained(str(model_dir.path), **kwargs)
    # SafetensorError: a truncated or corrupt shard; RuntimeError: weights of other shapes than config.json's
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise ZebraError(
            f"MODEL {model_dir.path}: cannot load ({_load_problem(e, model_dir.path)})",
            fix="check that the folder holds config.json and model.safetensors (re-export with zebra convert)",
        ) from None
    check_finite_weights(lm, model_dir.path)
    return lm.to(device).eval(), tok


@contextlib.contextmanager
def _load_report_held() -> Iterator[None]:
    """transformers' multi-line LOAD REPORT (missing, unexpected or mismatched weights) logged only when the load
    succeeds: a load that fails is told in the one line of its ZebraError."""
    import logging

    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if "LOAD REPORT" not in str(record.msg):
            return True
        held.append(record)
        return False

    logger = logging.getLogger("transformers.modeling_utils")  # the logger the report is given
    logger.addFilter(hold)
    try:
        yield
    finally:
        logger.removeFilter(hold)
    for record in held:  # reached on success only
        logger.handle(record)


def _load_problem(error: BaseException, folder: Path) -> str:
    """transformers' load error in one line: weights of other shapes than the config's say so; a weights file
    that safetensors cannot read is named."""
    if isinstance(error, RuntimeError) and "mismatch" in str(error):
        return "its weights do not fit its config.json: tensors of other shapes"
    broken = _unreadable_weights(folder) if type(error).__name__ == "SafetensorError" else None
    return f"{broken}: {first_line(error)}" if broken else first_line(error)


def _unreadable_weights(folder: Path) -> Path | None:
    """The first `*.safetensors` file of `folder` that safetensors cannot open (cut short, not safetensors)."""
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception:  # SafetensorError, or an OSError reading it: this is the file
            return file
    return None


def check_finite_weights(model: Any, where: str | Path) -> None:
    """Refuse a model whose weights hold NaN or infinities: its logits would too, and the text generated or the
    accuracy measured from them would be noise (NUL bytes, acc 0.5) behind exit status 0.

    Raises:
        ZebraError: naming the first weights that are not finite.
    """
    import torch

    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise ZebraError(
            f"MODEL {where}: weights hold NaN or infinite values ({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''})",
            fix="the weights are broken (a diverged run, a corrupt file): export an earlier checkpoint, or "
            "retrain; zebra verify MODEL shows it",
        )


def _load_tokenizer(model_dir: ModelDir, tokenizer: str | None) -> Any:
    source = tokenizer_source(model_dir, tokenizer)
    try:
        return load_tokenizer(source)
    except ZebraError as e:
        if tokenizer is not None:
            raise  # load_tokenizer's message names --tokenizer
        raise ZebraError(
            f"MODEL {model_dir.path}: no usable tokenizer ({e.message})",
            fix="pass --tokenizer with the model's tokenizer (a hub id, a folder or byte), or copy its "
            "tokenizer files (tokenizer.json, tokenizer_config.json) into the model folder",
        ) from None
