"""Calibration text: token sequences in the teacher's tokenizer, and the second moments of the teacher's attention
inputs on them.

Two users: SMART's scores (`zebra upcycle --compose ... --placement smart`) and the activation-aware SVD of the MLA
initialisation (`zebra upcycle --svd activation`), which factorises W L instead of W (L L^T = C), where

    C_l = (1/N) sum over the N calibration tokens of x x^T     x: the input of teacher layer l's attention
                                                                (after its input RMSNorm), [D]

so that the kept rank minimises the error of W x on the teacher's own inputs instead of the error of W itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import torch

    from zebra.upcycle.teachers.teacher import Teacher


class _Reached(Exception):
    """Raised by the last layer's hook to end a calibration forward early."""


@dataclass(frozen=True)
class Calibration:
    """Where the calibration text is and how much of it to read."""

    data: str  # a prepared folder or Megatron prefix, in the teacher's tokenizer
    samples: int = 256  # sequences
    seq_len: int = 512  # tokens per sequence
    device: str = "auto"  # where the teacher runs
    batch_size: int = 8


def attention_input_moments(
    teacher: Teacher, calibration: Calibration, layers: Sequence[int]
) -> tuple[dict[int, torch.Tensor], int]:
    """({layer: C_l [D, D] float64 on the CPU}, calibration tokens) for the teacher's `layers`.

    The teacher (its HF model, bf16 on a GPU, float32 on the CPU) runs over the calibration sequences up to the
    last chosen layer's attention; a forward pre-hook on each chosen layer's attention adds x^T x of its input.
    """
    import torch

    from zebra.core.device import resolve_device
    from zebra.upcycle.teachers.causal_lm import build_teacher_model, teacher_dtype

    tokens = calibration_tokens(calibration.data, teacher.tokenizer, teacher.shape.vocab_size,
                                calibration.samples, calibration.seq_len)  # fmt: skip  # [S, T]
    dev = torch.device(resolve_device(calibration.device))
    model = build_teacher_model(teacher, teacher_dtype(dev)).to(dev).eval()
    sums = {i: torch.zeros(teacher.shape.hidden_size, teacher.shape.hidden_size, dtype=torch.float64)
            for i in layers}  # fmt: skip

    last = max(layers)

    def add(layer: int):
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [b, T, D]
            x = hidden.flatten(0, 1).float()  # [b*T, D]
            sums[layer] += (x.T @ x).double().cpu()
            if layer == last:
                raise _Reached  # the layers after it are not needed

        return hook

    handles = [
        model.model.layers[i].self_attn.register_forward_pre_hook(add(i), with_kwargs=True) for i in layers
    ]
    try:
        with torch.no_grad():
            for start in range(0, tokens.shape[0], calibration.batch_size):
                with contextlib.suppress(_Reached):
                    model.model(
                        input_ids=tokens[start : start + calibration.batch_size].to(dev), use_cache=False
                    )
    finally:
        for handle in handles:
            handle.remove()
    return {i: s / tokens.numel() for i, s in sums.items()}, int(tokens.numel())


def calibration_tokens(
    spec: str, tokenizer: Any, vocab_size: int, samples: int, seq_len: int
) -> torch.Tensor:
    """Up to `samples` sequences `[S, seq_len]` of consecutive tokens from the data at `spec`; refuses data in
    another tokenizer than the teacher's (`tokenizer`, may be None) or with ids beyond its vocabulary."""
    import numpy as np
    import torch

    from zebra.data.indexed import open_dataset
    from zebra.data.paths import parse_data_path
    from zebra.data.prefixes import resolve_prefixes

    path = parse_data_path(spec)  # the one parse of the text: the DataPath goes on into data/
    _check_tokenizer(spec, path.target, tokenizer)
    need, pieces, have = samples * seq_len, [], 0
    for prefix, _ in resolve_prefixes(path, tokenizer="byte"):
        dataset = open_dataset(prefix)
        for i in range(len(dataset)):
            pieces.append(np.asarray(dataset[i], dtype=np.int64))
            have += len(pieces[-1])
            if have >= need:
                break
        if have >= need:
            break
    count = min(samples, have // seq_len)
    if count == 0:
        raise ZebraError(f"--calibration {spec}: fewer than {seq_len} tokens",
                         fix="pass more data, or a shorter --seq-len")  # fmt: skip
    flat = np.concatenate(pieces)[: count * seq_len]
    if int(flat.max()) >= vocab_size:
        raise ZebraError(
            f"--calibration {spec}: token id {int(flat.max())} is beyond the teacher's {vocab_size} ids",
            fix="tokenize the calibration data with the teacher's tokenizer (zebra data prep --tokenizer T)",
        )
    return torch.from_numpy(flat).view(count, seq_len)


def _check_tokenizer(spec: str, target: str, tokenizer: Any) -> None:
    """The data's recorded tokenizer (a prepared folder's manifest; @sample: byte) against the teacher's."""
    if tokenizer is None:
        return
    from zebra.data import load_tokenizer, read_manifest
    from zebra.data.paths import BUNDLED, prep_folder
    from zebra.data.tokenizers import recorded_vocabulary, vocabulary

    if target == BUNDLED:
        found: tuple[int, str] | None = vocabulary(load_tokenizer("byte"))
    else:
        folder = prep_folder(target) or prep_folder(Path(target).expanduser().parent)
        found = recorded_vocabulary(read_manifest(folder).tokenizer) if folder is not None else None
    want = vocabulary(tokenizer)
    if found is not None and found != want:
        raise ZebraError(
            f"--calibration {spec}: tokenized with another tokenizer ({found[0]} ids, vocabulary "
            f"{found[1][:12]}) than the teacher's ({want[0]} ids, vocabulary {want[1][:12]})",
            fix="prepare the calibration data with the teacher's tokenizer (zebra data prep --tokenizer TEACHER)",
        )
