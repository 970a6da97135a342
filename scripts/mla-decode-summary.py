"""The compact summary of scripts/gpu-session.sh's `mla-decode` phase (issue 41 items 1-2) from the
`zebra bench decode --json` reports it leaves in OUT (decode_mla_<recipe>.json):

    python3 scripts/mla-decode-summary.py OUT [--top 15]

Per report: the step against the roofline measured in the same run; the real-length rows (a large cache against
one sized to the prompt: the goal is a ratio within 5%); the step's kernels (calls and microseconds per step);
for a recipe benched with and without `--fused-decode` (the `fused-decode` phase), the fused step against the
other at each batch size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LENGTH_GOAL = 1.05  # large-capacity step / sized step (issue 41 item 2)


def summary(report: dict, top: int) -> list[str]:
    lines = [
        f"## {report['model']} on {report['device']}, {report['dtype']}, torch {report['torch_version']}"
        f"{', fused decode GEMVs' if report.get('fused_decode') else ''}"
    ]
    for r in report["rows"]:
        lines.append(
            f"batch {r['batch']}: step {r['step_ms_per_token']:.3f} ms/token, generate loop "
            f"{r['decode_ms_per_token']:.3f} ({r['loop_over_step']:.2f}x the step), roofline {r['roofline_ms']:.3f} ms "
            f"({report['bandwidth_gb_s']:,.0f} GB/s measured), step/roofline {r['roofline_ratio']:.2f}x"
        )
    if report.get("length_rows"):
        lines.append("| cached | ms/token, capacity | ms/token, sized cache | ratio | within 5% |")
        lines.append("|---|---|---|---|---|")
        for r in report["length_rows"]:
            ok = "yes" if r["ratio"] <= LENGTH_GOAL else "**no**"
            lines.append(
                f"| {r['cached']:,} | {r['capacity_ms_per_token']:.3f} ({r['capacity']:,}) | "
                f"{r['sized_ms_per_token']:.3f} ({r['sized_capacity']:,}) | {r['ratio']:.3f} | {ok} |"
            )
    profile = report.get("profile")
    if profile:
        roof = profile["roofline_ms"]
        lines.append(
            f"profile, batch {profile['batch']} ({profile['mode']}, {profile['source']}): "
            f"{profile['kernels_per_step']:g} per step, {profile['kernel_us_per_step'] / 1e3:.3f} ms of them, "
            f"step {profile['step_ms']:.3f} ms under the profiler, roofline {roof:.3f} ms"
        )
        lines.append("| kernel | calls/step | us/step | share |")
        lines.append("|---|---|---|---|")
        for r in profile["rows"][:top]:
            lines.append(
                f"| `{r['name'][:80]}` | {r['calls_per_step']:g} | {r['us_per_step']:.1f} | {r['share']:.1%} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    paths = sorted(args.out.glob("decode_mla_*.json"))
    if not paths:
        print(f"mla-decode: no decode_mla_*.json in {args.out}")
    reports = {}
    for path in paths:
        try:
            reports[path.stem] = report = json.loads(path.read_text())
        except ValueError:
            print(f"## {path.name}: not a JSON report (see bench.log)")
            continue
        print("\n".join(summary(report, args.top)))
    for name, fused in reports.items():
        base = reports.get(name.removesuffix("-fused") + "-base")
        if name.endswith("-fused") and base is not None:
            for b, f in zip(base["rows"], fused["rows"], strict=False):
                print(
                    f"{fused['model']} batch {f['batch']}: fused step {f['step_ms_per_token']:.3f} ms against "
                    f"{b['step_ms_per_token']:.3f} (speedup {b['step_ms_per_token'] / f['step_ms_per_token']:.3f}), "
                    f"step/roofline {f['roofline_ratio']:.2f}x against {b['roofline_ratio']:.2f}x"
                )


if __name__ == "__main__":
    main()
