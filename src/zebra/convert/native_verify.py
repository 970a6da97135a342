"""`zebra verify` of a transformers-native export (`zebra convert --to qwen3-next | qwen3.5 | bamba |
granite-hybrid | kimi-linear`).

The export is loaded by transformers' own class (`AutoModelForCausalLM`, no `trust_remote_code`) in float32 and
compared with its Zebra source run by `ZebraForCausalLM` in float64, the closest thing to the exact result on
hand. The pass line is the noise floor measured in the same run: the source's own float32 forward against its
float64 forward. Two float32 implementations of the same function each carry about that much rounding error, so
the native model passes when its error is at most `NOISE_FACTOR` times the floor; a wrong permutation, norm or
missing bias costs 1e-2 to 1 (issue 44's table), five orders of magnitude above. The greedy continuation of both
(transformers' cached `generate()` against Zebra's recomputed argmax) must be the same tokens.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from zebra.convert.audit import audit, expected_shapes, meta_model
from zebra.convert.native import MODEL_TYPES, stored_shapes

NOISE_FACTOR = 4.0


def cached_greedy(model: Any, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
    """`model.generate()` greedy with a cache, as it works in transformers 5.25 for every native export.

    A model whose layers are all linear attention (pure GDN / Mamba2 / KDA) fails in `generate()` with "get_mask_sizes
    can only be called on Attention layers": the causal mask, which no layer of it uses, is sized from the cache's
    attention layers and it has none. One empty attention slot appended to the cache gives the mask a size; it is
    never written, and the recurrent layers' slots are the ones `generate()` reads and updates.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from zebra.models.modeling_zebra import CACHE_FIELD  # `cache`, or `past_key_values` before its rename

    cache = DynamicCache(config=model.config)
    cache.layers.append(DynamicLayer())
    with torch.no_grad():
        out = model.generate(
            input_ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, **{CACHE_FIELD: cache}
        )
    return out[0, input_ids.shape[1] :].tolist()


def zebra_greedy(model: Any, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
    """Greedy tokens of a `ZebraForCausalLM` by full recompute (no cache involved)."""
    seq = input_ids
    with torch.no_grad():
        for _ in range(max_new_tokens):
            nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    return seq[0, input_ids.shape[1] :].tolist()


def native_audit(directory: Path, weights: dict[str, tuple[int, ...]]) -> Any:
    """The export's tensors against its own class on the meta device, in the names its checkpoints store."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(directory)
    model = meta_model(AutoModelForCausalLM.from_config, config)
    expected, tied = expected_shapes(model)
    to = {t: name for name, t in MODEL_TYPES.items()}[config.model_type]
    return audit(weights, stored_shapes(to, expected), tied=tied, target=type(model).__name__)


def load_native(directory: Path, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return model.to(device).eval()


def float64_copy(model: Any) -> Any:
    """The Zebra model again in float64 with the torch kernels (float64 end to end)."""
    config = copy.deepcopy(model.config)
    config.kernel_backend = "torch"
    twin = type(model)(config)
    twin.load_state_dict(model.state_dict())
    return twin.to(device="cpu", dtype=torch.float64).eval()


def logits(model: Any, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    device = next(model.parameters()).device
    with torch.no_grad():
        return [model(input_ids=ids.to(device), use_cache=False).logits.double().cpu() for ids in inputs]


def max_abs(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
