"""What the teacher's attention does on calibration text, layer by layer: the records the calibration fits to.

One forward of the teacher (eager attention, so the attention maps exist) over the calibration sequences; hooks on
each chosen layer's attention keep

    inputs   x [S, T, D]   the attention's input (after the layer's input RMSNorm): what the student's mixer gets
    outputs  y [S, T, D]   the attention's output (after o_proj): what the student's mixer must reproduce
    distance [H]           per query head, the mean over rows i of E_j[i - j] under the attention row p_i
    entropy  [H]           per query head, the mean over rows of -sum_j p_ij ln p_ij (nats)

The maps themselves are reduced to the two per-head statistics as they go (never kept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from zebra.upcycle.teachers.teacher import Teacher


@dataclass
class LayerRecord:
    """One teacher layer's attention on the calibration sequences (float32, on the CPU)."""

    inputs: torch.Tensor  # [S, T, D]
    outputs: torch.Tensor  # [S, T, D]
    distance: torch.Tensor  # [H] mean attention distance in tokens
    entropy: torch.Tensor  # [H] mean attention-row entropy in nats
    stream: torch.Tensor | None = None  # [S, T, D] the layer's input before its norm (keep_stream)


def attention_statistics(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over rows of the mean distance [H], sum over rows of the entropy [H]) of attention maps
    `probs [B, H, T, T]` (causal rows summing to 1); divide by B * T for the means."""
    import torch

    T = probs.shape[-1]
    positions = torch.arange(T, dtype=probs.dtype, device=probs.device)
    gap = (positions[:, None] - positions[None, :]).clamp(min=0)  # [T, T] i - j
    distance = (probs * gap).sum(dim=-1)  # [B, H, T]
    entropy = -(probs * probs.clamp(min=1e-30).log()).sum(dim=-1)  # [B, H, T]
    return distance.sum(dim=(0, 2)), entropy.sum(dim=(0, 2))


def record_attention(
    teacher: Teacher,
    tokens: torch.Tensor,
    layers: Sequence[int],
    *,
    device: str = "auto",
    batch_size: int = 4,
    on_progress: Callable[[int, int], None] | None = None,
    keep_stream: bool = False,
) -> dict[int, LayerRecord]:
    """{layer: its `LayerRecord`} for the teacher's `layers` on `tokens [S, T]` (a forward up to the last one).

    The teacher runs float32 on the CPU, bf16 on a GPU (`teacher_dtype`); the records are float32 on the CPU.
    `keep_stream` also keeps each layer's input before its norm (`LayerRecord.stream`).
    """
    import torch

    from zebra.core.device import resolve_device
    from zebra.upcycle.teachers.causal_lm import build_teacher_model, teacher_dtype

    dev = torch.device(resolve_device(device))
    model = build_teacher_model(teacher, teacher_dtype(dev)).to(dev).eval()
    model.config._attn_implementation = "eager"  # the attention maps are returned only by the eager path
    S, T = tokens.shape
    H = teacher.shape.num_heads
    found: dict[int, dict[str, Any]] = {i: {"x": [], "y": [], "h": [], "d": torch.zeros(H), "e": torch.zeros(H)}
                                        for i in layers}  # fmt: skip

    def keep_input(layer: int):
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [b, T, D]
            found[layer]["x"].append(hidden.float().cpu())

        return hook

    def keep_output(layer: int):
        def hook(module: Any, args: tuple, output: tuple) -> None:
            attn_output, probs = output[0], output[1]  # [b, T, D], [b, H, T, T]
            found[layer]["y"].append(attn_output.float().cpu())
            distance, entropy = attention_statistics(probs.float())
            found[layer]["d"] += distance.cpu()
            found[layer]["e"] += entropy.cpu()

        return hook

    def keep_stream_of(layer: int):
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [b, T, D]
            found[layer]["h"].append(hidden.float().cpu())

        return hook

    handles = []
    for i in layers:
        if keep_stream:
            handles.append(
                model.model.layers[i].register_forward_pre_hook(keep_stream_of(i), with_kwargs=True)
            )
        attention = model.model.layers[i].self_attn
        handles.append(attention.register_forward_pre_hook(keep_input(i), with_kwargs=True))
        handles.append(attention.register_forward_hook(keep_output(i)))
    keep = max(layers) + 1
    all_layers = model.model.layers
    model.model.layers = all_layers[:keep]  # the layers after the last chosen one are not needed
    try:
        with torch.no_grad():
            for start in range(0, S, batch_size):
                model.model(input_ids=tokens[start : start + batch_size].to(dev), use_cache=False)
                if on_progress is not None:
                    on_progress(min(start + batch_size, S), S)
    finally:
        model.model.layers = all_layers
        for handle in handles:
            handle.remove()
    rows = S * T
    return {
        i: LayerRecord(
            torch.cat(f["x"]),
            torch.cat(f["y"]),
            f["d"] / rows,
            f["e"] / rows,
            torch.cat(f["h"]) if f["h"] else None,
        )
        for i, f in found.items()
    }
