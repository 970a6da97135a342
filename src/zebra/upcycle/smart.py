"""SMART placement (Zebra-Llama): which layers of the hybrid become MLA, chosen by how much each one helps.

    scores     start from the ILD-trained all-recurrent student; for each dense layer i on its own, swap in layer
               i (mixer + MLP) of the ILD-trained all-MLA student and measure KL(p_teacher || p_student) per token
               on calibration sequences; score_i = KL(all-recurrent) - KL(layer i MLA), how much the swap lowers it
    selection  N layers with the highest total score such that layer 0 and layer L-2 are MLA and every gap between
               consecutive MLA layers is floor((L-2)/(N-1)) or ceil((L-2)/(N-1)) (`smart_selection`); the released
               configs satisfy this: [0, 5, 10, 14] (L 16, N 4), [0, 5, 10, 16, 21, 26] (L 28, N 6)

The calibration data must be in the teacher's tokenizer (a prepared folder's manifest, @sample's byte tokenizer);
a prefix without a manifest is only checked against the vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.atomic import save_figure
from zebra.core.errors import ZebraError

if TYPE_CHECKING:
    import torch

    from zebra.upcycle.compose import Student

CHART_FILE = "smart-scores.png"


def smart_selection(scores: Sequence[float], count: int) -> tuple[int, ...]:
    """The `count` MLA layers (dense indices) of highest total score under SMART's constraints.

    Layer 0 and layer L-2 are always chosen and the gaps are floor or ceil of (L-2)/(count-1); with count 0, 1,
    L-1 or L the choice is forced (none, layer 0, layers 0..L-2, every layer). Ties are broken deterministically.
    """
    num_layers = len(scores)
    if not 0 <= count <= num_layers:
        raise ZebraError(f"--mla {count}: must be between 0 and {num_layers}, the students' layers",
                         fix=f"pass --mla {num_layers} or fewer")  # fmt: skip
    if count <= 1 or count >= num_layers - 1:
        return tuple(range(count))
    last = num_layers - 2
    gaps = sorted({last // (count - 1), math.ceil(last / (count - 1))})
    # best[k][p]: the highest score of k+1 MLA layers from layer 0 to p (the last one at p), via[k][p] its previous
    best: list[dict[int, float]] = [{0: scores[0]}]
    via: list[dict[int, int]] = [{}]
    for _ in range(1, count):
        row, back = {}, {}
        for prev, total in sorted(best[-1].items()):
            for gap in gaps:
                p = prev + gap
                if p <= last and (p not in row or total + scores[p] > row[p]):
                    row[p], back[p] = total + scores[p], prev
        best.append(row)
        via.append(back)
    chosen = [last]
    for k in range(count - 1, 0, -1):
        chosen.append(via[k][chosen[-1]])
    return tuple(reversed(chosen))


def smart_placement(
    mla: Student,
    recurrent: Student,
    count: int,
    calibration: str | None,
    *,
    samples: int = 256,
    seq_len: int = 512,
    batch_size: int = 8,
    device: str = "auto",
) -> dict[str, Any]:
    """SMART's scores and choice for two ILD students: a dict for upcycle.json (`kl` per layer, `scores`,
    `baseline_kl`, `selected`, the calibration data and its size)."""
    import torch

    from zebra.core.device import resolve_device
    from zebra.upcycle.calibration import calibration_tokens
    from zebra.upcycle.readers import open_teacher
    from zebra.upcycle.teachers.causal_lm import build_teacher_model, teacher_dtype

    if calibration is None:
        raise ZebraError("--placement smart needs --calibration DATA",
                         fix="pass a prepared data folder (zebra data prep) in the teacher's tokenizer")  # fmt: skip
    if count > recurrent.num_layers:
        smart_selection([0.0] * recurrent.num_layers, count)  # the one-line error
    dev = torch.device(resolve_device(device))
    dtype = teacher_dtype(dev)
    opened = open_teacher(recurrent.report.teacher)
    try:
        tokens = calibration_tokens(calibration, opened.tokenizer, opened.shape.vocab_size, samples, seq_len)
        teacher = build_teacher_model(opened, dtype).to(dev).eval()
    finally:
        opened.tensors.close()
    students = [load_student(s, dev, dtype) for s in (recurrent, mla)]
    baseline, kls = layer_kls(teacher, *students, tokens, batch_size)
    scores = [baseline - kl for kl in kls]
    return {
        "calibration": calibration,
        "sequences": int(tokens.shape[0]),
        "seq_len": int(tokens.shape[1]),
        "baseline_kl": baseline,
        "kl": kls,
        "scores": scores,
        "selected": list(smart_selection(scores, count)),
        "chart": CHART_FILE,
    }


def load_student(student: Student, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A student's ZebraForCausalLM from its export, in eval mode."""
    from zebra.models import ZebraForCausalLM

    model = ZebraForCausalLM.from_pretrained(student.folder, dtype=dtype)
    return model.to(device).eval()


def layer_kls(
    teacher: torch.nn.Module,
    recurrent: torch.nn.Module,
    mla: torch.nn.Module,
    tokens: torch.Tensor,
    batch_size: int,
) -> tuple[float, list[float]]:
    """(KL per token of `recurrent`, [KL per token with dense layer i taken from `mla`, for each i]) against the
    teacher on `tokens` `[S, T]`."""
    import torch

    layers = recurrent.model.layers  # sublayers 2i, 2i+1 = dense layer i
    num_layers = len(layers) // 2
    sums = torch.zeros(num_layers + 1, dtype=torch.float64)  # [baseline, layer 0, ...]
    device = next(recurrent.parameters()).device
    with torch.no_grad():
        for start in range(0, tokens.shape[0], batch_size):
            ids = tokens[start : start + batch_size].to(device)  # [b, T]
            log_p = torch.log_softmax(teacher(input_ids=ids, use_cache=False).logits.float(), -1)  # [b, T, V]
            sums[0] += _kl_sum(log_p, recurrent, ids)
            for i in range(num_layers):
                own = layers[2 * i], layers[2 * i + 1]
                layers[2 * i], layers[2 * i + 1] = mla.model.layers[2 * i], mla.model.layers[2 * i + 1]
                try:
                    sums[1 + i] += _kl_sum(log_p, recurrent, ids)
                finally:
                    layers[2 * i], layers[2 * i + 1] = own
    means = (sums / tokens.numel()).tolist()
    return means[0], means[1:]


def _kl_sum(log_p: torch.Tensor, student: torch.nn.Module, ids: torch.Tensor) -> float:
    """Sum over tokens of KL(p || q_student); log_p `[b, T, V]` the teacher's log-probabilities."""
    import torch

    log_q = torch.log_softmax(student(input_ids=ids, use_cache=False).logits.float(), -1)  # [b, T, V]
    return float((log_p.exp() * (log_p - log_q)).sum())


def plot_scores(smart: dict[str, Any], path: Path) -> Path:
    """A bar chart of the scores, the chosen layers highlighted; written to a temporary name, then renamed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores, chosen = smart["scores"], set(smart["selected"])
    fig, ax = plt.subplots(figsize=(max(5.0, 0.3 * len(scores)), 3.2))
    ax.bar(
        range(len(scores)),
        scores,
        color=["tab:orange" if i in chosen else "tab:blue" for i in range(len(scores))],
    )
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xlabel("layer (orange: MLA)")
    ax.set_ylabel("KL lowered by MLA here")
    ax.set_title(f"SMART scores, {smart['sequences']} calibration sequences")
    fig.tight_layout()
    try:
        return save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
