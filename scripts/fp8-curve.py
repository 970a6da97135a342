"""Issue 18's FP8 condition: an FP8 run's loss curve within 1% of its bf16 twin's (same recipe, data, seed) over
1,000 steps on real text. Reads both runs' metrics.jsonl (logged every step), compares the mean loss of each
WINDOW-step window, prints one JSON line and draws both curves into one PNG (`zebra plot`'s drawing).

    python3 scripts/fp8-curve.py RUNS/bf16 RUNS/fp8 --out fp8_curve.json --png fp8_curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zebra.train.metrics import read_metrics
from zebra.train.plot import plot_runs

LIMIT = 0.01  # the largest relative gap of window means that still counts
WINDOW = 50  # steps per window: one step's loss moves with its batch, a window's mean with the model


def step_losses(run: Path) -> dict[int, float]:
    return {
        r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if isinstance(r.get("loss"), float)
    }


def median_tokens_per_s(run: Path) -> float:
    rates = sorted(r["tokens_per_s"] for r in read_metrics(run / "metrics.jsonl") if r.get("tokens_per_s"))
    return rates[len(rates) // 2]


def compare(reference: dict[int, float], candidate: dict[int, float], window: int = WINDOW) -> dict:
    """Window means of the steps both runs logged: the largest (candidate - reference) / reference by size and
    the last window's."""
    steps = sorted(reference.keys() & candidate.keys())
    gaps = []
    for start in range(0, len(steps) - window + 1, window):
        chunk = steps[start : start + window]
        ref = sum(reference[s] for s in chunk) / window
        cand = sum(candidate[s] for s in chunk) / window
        gaps.append(
            {
                "steps": f"{chunk[0]}-{chunk[-1]}",
                "reference": ref,
                "candidate": cand,
                "rel": (cand - ref) / ref,
            }
        )
    if not gaps:
        raise SystemExit(
            f"error: fewer than {window} steps logged by both runs; log every step (train.log_interval=1)"
        )
    worst = max(gaps, key=lambda g: abs(g["rel"]))
    return {
        "steps": len(steps),
        "window": window,
        "max_rel_gap": worst["rel"],
        "max_rel_gap_steps": worst["steps"],
        "final_window": gaps[-1],
        "within_1pct": abs(worst["rel"]) <= LIMIT,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path, help="the bf16 run directory")
    parser.add_argument("candidate", type=Path, help="the FP8 run directory")
    parser.add_argument("--out", type=Path, required=True, help="the JSON result")
    parser.add_argument("--png", type=Path, help="both loss curves")
    args = parser.parse_args()
    result = compare(step_losses(args.reference), step_losses(args.candidate))
    speeds = {"reference_tokens_per_s": median_tokens_per_s(args.reference),
              "candidate_tokens_per_s": median_tokens_per_s(args.candidate)}  # fmt: skip
    result = {"reference": str(args.reference), "candidate": str(args.candidate), **result, **speeds}
    args.out.write_text(json.dumps(result) + "\n")
    print(json.dumps(result))
    if args.png:
        plot_runs([args.reference, args.candidate], args.png)


if __name__ == "__main__":
    main()
