"""One model call for decoding: token ids and a cache in, last-position logits and the cache out.

The call adapts to the model's signature once (`logits_forward(model)`), so the runners and the engine work with
any causal LM: ZebraForCausalLM, FLA's classes, or a transformers model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

LogitsForward = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]]


def logits_forward(model: torch.nn.Module) -> LogitsForward:
    """`forward(ids [B, T], cache) -> (logits [B, V] float32 after the last position, the cache)` for `model`.

    Only the last position's logits are computed when the model takes `logits_to_keep`. The cache argument is
    `cache` in transformers >= 5.2x and `past_key_values` in older models and FLA.
    """
    params = inspect.signature(model.forward).parameters
    keep_last = "logits_to_keep" in params
    cache_arg = "cache" if "cache" in params else "past_key_values"

    def forward(ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        kwargs: dict[str, Any] = {cache_arg: cache}
        if keep_last:
            kwargs["logits_to_keep"] = 1
        out = model(input_ids=ids, use_cache=True, **kwargs)
        keys = out.keys()
        new_cache = (
            out["cache"]
            if "cache" in keys
            else out["past_key_values"]
            if "past_key_values" in keys
            else cache
        )
        return out.logits[:, -1].float(), new_cache

    return forward
