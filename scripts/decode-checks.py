"""The table of the decode checks (issue 15 item 17, issue 18 items 1, 2, 5) from the files that the
`decode-checks` phase of scripts/gpu-session.sh leaves in OUT; a check whose files are missing reads "not run".

    python3 scripts/decode-checks.py OUT

Files read (each written by one part of the phase, see the script's header):
- pytest_decode.log: the decode engine's GPU tests (`-v -rA` output);
- decode_ab.jsonl: scripts/decode-ab.py lines, labelled before / after / compile;
- decode_fla.json: `zebra bench decode 1b-gdn-pure --batch 1 --json` (FLA's class with HF generate);
- warm_cold.json, warm_warm.json: `zebra bench train --json` on an empty, then a filled kernel cache.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ITEM17_TESTS = ("growing_and_shrinking", "8_then_1_then_256")
LOOP_GOAL = 1.10  # generate ms / step ms (item 1: within 10%)
STEP_GOALS = {"1b-gdn-pure": 1.2, "1b-mamba-mla": 1.5}  # ms per token at batch 1 (item 2)
WARM_GOAL_S = 20.0  # seconds to the first step of a second run (item 5)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def verdict(ok: bool | None) -> str:
    return "not run" if ok is None else ("met" if ok else "**missed**")


def test_rows(log: Path) -> list[tuple[str, str, str, str]]:
    if not log.exists():
        return [("17: GPU tests (graph decode = eager, across requests)", "all pass", "not run", "not run")]
    text = log.read_text()
    summary = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    rows = []
    for name in ITEM17_TESTS:
        passed = re.search(rf"PASSED \S*{name}", text) is not None
        failed = re.search(rf"(FAILED|ERROR) \S*{name}", text) is not None
        ok = True if passed and not failed else (False if failed else None)
        rows.append(
            (f"17: `{name}`", "passes", "passed" if ok else ("failed" if failed else "absent"), verdict(ok))
        )
    last = summary[-1].strip("= ") if summary else "no summary (timed out?)"
    rows.append(
        ("17, 1: every decode GPU test", "all pass", last, verdict("failed" not in last and bool(summary)))
    )
    return rows


def ab_rows(lines: list[dict]) -> list[tuple[str, str, str, str]]:
    by = {(r["label"], r["recipe"], r["batch"]): r for r in lines}
    rows = []
    for recipe in STEP_GOALS:
        for batch in (1, 8):
            after, before = by.get(("after", recipe, batch)), by.get(("before", recipe, batch))
            compiled = by.get(("compile", recipe, batch))
            if after is None:
                rows.append((f"1, 2: {recipe} batch {batch}", "", "not run", "not run"))
                continue
            ratio = after["generate_over_step"]
            rows.append(
                (
                    f"1: {recipe} batch {batch}, generate / step",
                    f"<= {LOOP_GOAL:.2f}",
                    f"{after['generate_ms']:.3f} / {after['step_ms']:.3f} ms = {ratio:.3f}",
                    verdict(ratio <= LOOP_GOAL),
                )
            )
            was = (
                ""
                if before is None
                else f" (before {before['step_ms']:.3f} ms, {before['kernels_per_step']} kernels)"
            )
            goal = STEP_GOALS[recipe] if batch == 1 else None
            rows.append(
                (
                    f"2: {recipe} batch {batch}, step ms",
                    "" if goal is None else f"<= {goal}",
                    f"{after['step_ms']:.3f} ms, {after['kernels_per_step']} kernels{was}",
                    "" if goal is None else verdict(after["step_ms"] <= goal),
                )
            )
            if compiled is not None:
                rows.append((f"2: {recipe} batch {batch}, step ms with --compile", "measure",
                             f"{compiled['step_ms']:.3f} ms", ""))  # fmt: skip
    return rows


def fla_rows(report: dict | None) -> list[tuple[str, str, str, str]]:
    if report is None:
        return [("2: FLA's class + HF generate, batch 1", "a row", "not run", "not run")]
    rows = []
    for row in report["rows"]:
        fla = row.get("fla_decode_ms_per_token")
        got = f"{fla:.2f} ms/tok vs zebra {row['decode_ms_per_token']:.3f}" if fla else str(report.get("fla"))
        rows.append(
            (f"2: FLA's class + HF generate, batch {row['batch']}", "a row", got, verdict(fla is not None))
        )
    return rows


def warm_rows(cold: dict | None, warm: dict | None) -> list[tuple[str, str, str, str]]:
    if warm is None:
        return [("5: time to first step, second run", f"< {WARM_GOAL_S:.0f} s", "not run", "not run")]
    row = warm["rows"][0]
    seconds = row.get("first_step_process_s") or row["first_step_s"]
    was = "" if cold is None else f" (cold {cold['rows'][0].get('first_step_process_s') or -1:.1f} s)"
    name = f"5: {warm.get('recipe', row.get('model', ''))} first step, second run (s after process start)"
    return [(name, f"< {WARM_GOAL_S:.0f} s", f"{seconds:.1f} s{was}", verdict(seconds < WARM_GOAL_S))]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    rows = [
        *test_rows(out / "pytest_decode.log"),
        *ab_rows(read_lines(out / "decode_ab.jsonl")),
        *fla_rows(read_json(out / "decode_fla.json")),
        *warm_rows(read_json(out / "warm_cold.json"), read_json(out / "warm_warm.json")),
    ]
    print("| item: check | goal | measured | |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
