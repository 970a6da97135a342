"""GGUF teachers (llama.cpp files), read and dequantised one tensor at a time.

The config and the tokenizer come from transformers' GGUF loader (`load_gguf_checkpoint`, `AutoTokenizer` with
`gguf_file`); the tensors from the `gguf` package's reader, renamed with its tensor-name map and passed through
transformers' per-architecture tensor processor, which undoes llama.cpp's query/key row permutation (llama.cpp
stores Llama's q/k heads in pair-interleaved RoPE order; HF's is rotate-half). Quantised tensors are dequantised
to float32, so the teacher's dtype is float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from zebra.convert.tensor_sources import Shapes, TensorSource
from zebra.core.errors import ZebraError, first_line
from zebra.upcycle.teachers.teacher import Teacher, check_tensors, expected_shapes, shape_from_hf_config


class GGUFSource(TensorSource):
    """The tensors of a GGUF file under HF names (`names`: GGUF name -> HF name), dequantised on `get`."""

    def __init__(self, path: Path, arch: str, config: dict[str, Any], hf_names: list[str]):
        import gguf
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        self.origin = str(path)
        self._reader = gguf.GGUFReader(path)
        self._processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config)
        gguf_arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
        if gguf_arch is None:
            raise ZebraError(f"{path}: GGUF architecture {arch!r} is unknown to the gguf package",
                             fix="upgrade gguf (pip install -U gguf)")  # fmt: skip
        name_map = gguf.get_tensor_name_map(gguf_arch, config["num_hidden_layers"])
        to_hf = {}
        for hf_name in hf_names:
            base, _, suffix = hf_name.rpartition(".")
            gguf_name = name_map.get_name(base)
            if gguf_name is not None:
                to_hf[f"{gguf_name}.{suffix}"] = hf_name
        self._tensors = {to_hf.get(t.name, t.name): t for t in self._reader.tensors}

    def shapes(self) -> Shapes:
        # GGUF lists dimensions fastest-first; numpy (and torch) order is the reverse
        return {
            name: (tuple(int(n) for n in reversed(t.shape)), torch.float32)
            for name, t in self._tensors.items()
        }

    def get(self, name: str) -> torch.Tensor:
        import gguf

        t = self._tensors[name]
        weights = gguf.dequantize(t.data, t.tensor_type)  # float32, row-major in HF order
        weights = self._processor.process(
            weights=weights, name=t.name, tensor_key_mapping={}, parsed_parameters={}
        )
        return torch.from_numpy(weights.weights.copy()).reshape(self.shapes()[name][0])


def open_gguf(path: Path, *, with_tokenizer: bool = True) -> Teacher:
    """Open a `.gguf` teacher; refuses architectures other than the Llama family (transformers' GGUF support)."""
    import importlib.util

    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    if importlib.util.find_spec("gguf") is None:
        raise ZebraError(
            f"{path}: reading GGUF files needs the gguf package", fix="pip install 'zebra-llama[upcycle]'"
        )

    try:
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    except (ValueError, KeyError, OSError) as e:
        raise ZebraError(
            f"{path}: not a GGUF model transformers can read ({first_line(e, 160)})",
            fix="use a GGUF of a Llama-family model (llama, qwen2, qwen3), or its HF folder",
        ) from None
    config = parsed["config"]
    shape = shape_from_hf_config(config, str(path))
    arch = _gguf_arch(config["model_type"])
    source = GGUFSource(path, arch, config, list(expected_shapes(shape)))
    check_tensors(shape, {n: s for n, (s, _) in source.shapes().items()}, str(path))
    tokenizer = _tokenizer(path) if with_tokenizer else None
    return Teacher(shape, source, tokenizer, str(path), "gguf", torch.float32)


def _gguf_arch(model_type: str) -> str:
    """transformers calls llama.cpp's `llama` files with 'mistral' in their name `mistral`; llama.cpp does not."""
    return "llama" if model_type == "mistral" else model_type


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, OSError) as e:
        raise ZebraError(
            f"{path}: its tokenizer cannot be read ({first_line(e, 160)})",
            fix="pass --tokenizer with the model's HF tokenizer (hub id or folder)",
        ) from None
