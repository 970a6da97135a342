"""`export_native`: write a Zebra checkpoint as a transformers-native model folder (`zebra.convert.native`).

The folder holds `config.json` of the native class, sharded safetensors under its names, `generation_config.json`,
and the tokenizer with its chat template; it loads with `AutoModelForCausalLM.from_pretrained(dir)`, no
`trust_remote_code`. As every Zebra writer: planned and audited against the native class on the meta device
before anything is read, streamed one tensor at a time into a temporary folder renamed into place at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zebra.convert.audit import audit, expected_shapes, meta_model
from zebra.convert.native import TARGETS, native_config, plan, refusal, stored_shapes
from zebra.convert.tensor_sources import Shapes, TensorSource
from zebra.convert.writer import (
    DEFAULT_MAX_SHARD,
    SPECIAL_TOKEN_IDS,
    load_tokenizer_to_ship,
    output_dir,
    special_token_ids,
    stored_dtype,
    tensor_specs,
    with_chat_template,
    write_model_files,
)
from zebra.core.device import resolve_dtype
from zebra.mixers import NativeTensor


class NativeSource(TensorSource):
    """The native tensors of `plan`, each built from its Zebra tensors when it is fetched (one at a time)."""

    def __init__(self, base: TensorSource, tensors: list[NativeTensor]):
        self.base = base
        self.origin = base.origin
        self.tensors = {t.name: t for t in tensors}
        base_shapes = base.shapes()
        self._shapes: Shapes = {}
        for t in tensors:  # shapes without data: the same build on meta tensors
            parts = [
                torch.empty(base_shapes[s][0], dtype=base_shapes[s][1], device="meta") for s in t.sources
            ]
            self._shapes[t.name] = (tuple(t.build(parts).shape), base_shapes[t.sources[0]][1])

    def shapes(self) -> Shapes:
        return dict(self._shapes)

    def get(self, name: str) -> torch.Tensor:
        t = self.tensors[name]
        return t.build([self.base.get(s) for s in t.sources]).contiguous()

    def close(self) -> None:
        self.base.close()


def export_native(
    checkpoint: Any,
    output: Path,
    to: str,
    *,
    tokenizer: Any = None,
    dtype: str = "auto",
    force: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD,
    on_progress: Callable[[float, float | None, str], None] | None = None,
) -> Path:
    """Write `checkpoint` (a `zebra.convert.formats.Checkpoint`) as `--to to` (a key of `native.TARGETS`).

    Raises:
        ZebraError: the model cannot be written exactly (`native.refusal`: nothing is read or written), the
            plan does not fit the native class, an existing output without `force`.
    """
    from transformers import AutoModelForCausalLM

    cfg = checkpoint.config
    if (why := refusal(cfg, to)) is not None:
        raise why
    cast = resolve_dtype(dtype)
    tok = with_chat_template(load_tokenizer_to_ship(tokenizer))
    ids = special_token_ids({n: getattr(cfg, n, None) for n in SPECIAL_TOKEN_IDS}, tok)
    config = native_config(cfg, to, ids)
    source = NativeSource(checkpoint.tensors, plan(cfg, to, list(checkpoint.tensors.shapes())))
    expected, tied = expected_shapes(meta_model(AutoModelForCausalLM.from_config, config))
    expected = stored_shapes(to, expected)  # the names its checkpoints store, where transformers renames
    target = TARGETS[to].architecture
    shapes = {k: s for k, (s, _) in source.shapes().items()}
    audit(shapes, expected, tied=tied, target=target).raise_if_failed(f"{checkpoint.path} as {target}")
    specs = tensor_specs(source.shapes(), cast)
    with output_dir(Path(output), force=force) as tmp:
        write_model_files(
            tmp, specs, source, max_shard_size=max_shard_size, on_progress=on_progress, ids=ids, tok=tok
        )
        config.dtype = stored_dtype(specs)
        config.save_pretrained(tmp)
    return Path(output)
