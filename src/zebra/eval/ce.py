"""Held-out next-token cross-entropy of a causal LM over fixed token windows: the number every upcycling and
distillation figure compares (scripts/*-figure.py, scripts/upcycle-step0.py)."""

from __future__ import annotations

from typing import Any


def heldout_ce(model: Any, windows: Any, device: Any = None, bf16: bool = False, batch: int = 4) -> float:
    """Mean next-token CE (nats/token) of `model` over `windows [N, seq + 1]` (each window's first `seq` tokens in,
    its last `seq` the labels), in eval mode, `batch` windows a forward on `device` (default: where they are),
    under bf16 autocast with `bf16`; the logits are upcast to float32 for the loss."""
    import torch
    import torch.nn.functional as F

    model.eval()
    device = torch.device(device) if device is not None else windows.device
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for i in range(0, len(windows), batch):
            window = windows[i : i + batch].to(device)  # [b, seq + 1]
            logits = model(input_ids=window[:, :-1], use_cache=False).logits  # [b, seq, V]
            labels = window[:, 1:].flatten()
            total += F.cross_entropy(logits.flatten(0, 1).float(), labels, reduction="sum").item()
            count += labels.numel()
    return total / count
