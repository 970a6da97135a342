"""Logits that are not finite, from weights that are: the error generate, chat and eval give instead of noise.

Weights with NaN or infinities are refused at load (`zebra.generation.loading.check_finite_weights`). Finite
weights can still give NaN or infinite logits: a value past the dtype's range overflows (float16's 65504, a
bfloat16 or float32 product past 3.4e38), and what follows is NaN. Greedy decoding then picks token 0 every step
(NUL bytes), and lm-eval scores every choice alike (acc 0.5), behind exit status 0. The decode loop checks each
step's logits on the device (`TokenChooser.finite`) and raises `NonFiniteLogits`; eval checks each forward.
"""

from __future__ import annotations

from typing import Any

from zebra.core.errors import ZebraError


class NonFiniteLogits(ZebraError):
    """The model's logits hold NaN or infinite values (its weights are finite: an overflow)."""


def nonfinite_logits(model: Any, where: str = "") -> NonFiniteLogits:
    """The one-line error for `model` (a transformers model: its folder and dtype name the culprit and the fix);
    `where`: when it happened (`at new token 3`)."""
    name = getattr(model, "name_or_path", "") or "the model"
    dtype = str(getattr(model, "dtype", "")).removeprefix("torch.")
    narrow = dtype in ("float16", "bfloat16")
    if narrow:
        fix = f"its values overflow {dtype}: run it in float32 (--dtype fp32)"
    else:
        fix = (
            f"its weights drive the values past the range of {dtype or 'its dtype'} (a diverged run?): "
            "export an earlier checkpoint; zebra verify MODEL shows it"
        )
    return NonFiniteLogits(
        f"MODEL {name}: the logits hold NaN or infinite values ({', '.join(x for x in (where, dtype) if x)}), "
        "although its weights are finite",
        fix=fix,
    )


def check_logits_on_forward(model: Any) -> Any:
    """Make every forward of `model` raise `NonFiniteLogits` when its logits are not finite (lm-eval's calls,
    which zebra does not make itself); returns the hook's handle (`.remove()` it to stop)."""
    import torch

    def check(module: Any, args: Any, output: Any) -> None:
        logits = output["logits"] if isinstance(output, dict) or hasattr(output, "keys") else output[0]
        if not bool(torch.isfinite(logits).all()):
            raise nonfinite_logits(model, "an lm-eval request")

    return model.register_forward_hook(check)
