"""Where a process's wall-clock time went, from py-spy's sampled stacks (`py-spy record --idle --format raw`):
each function's inclusive seconds (samples whose stack holds it) and own seconds (samples where it is the leaf),
largest first, for the main thread (the seconds of other threads, such as Rich's refresh thread, are only
summed). Unlike cProfile it sees C calls and waits as they are, at little cost to the run.

    py-spy record --idle --nonblocking -r 100 --format raw -o stacks.txt -- python3 -m zebra.cli.main bench train ...
    python3 scripts/stack-summary.py stacks.txt --rate 100 --top 60
"""

from __future__ import annotations

import argparse
from collections import Counter


def summarize(lines, rate: float) -> tuple[Counter, Counter, float, float]:
    """(inclusive seconds, own seconds, main thread's seconds, other threads' seconds); frames are
    `function (file)`, the line number dropped."""
    inclusive, own, total, others = Counter(), Counter(), 0.0, 0.0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        seconds = int(count) / rate
        frames = [frame.rsplit(":", 1)[0] + ")" if ":" in frame else frame for frame in stack.split(";")]
        if frames[0].startswith("Thread._bootstrap"):
            others += seconds
            continue
        total += seconds
        for frame in set(frames):
            inclusive[frame] += seconds
        own[frames[-1]] += seconds
    return inclusive, own, total, others


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", help="py-spy's raw output (collapsed stacks with counts)")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="py-spy's sampling rate (-r), samples per second"
    )
    parser.add_argument("--top", type=int, default=60)
    args = parser.parse_args()
    with open(args.stacks) as f:
        inclusive, own, total, others = summarize(f, args.rate)
    print(f"main thread: {total:.1f} s sampled (other threads: {others:.1f} s)")
    for title, table in (("inclusive", inclusive), ("own", own)):
        print(f"\n{'s':>7} {'%':>5}  {title}")
        for frame, seconds in table.most_common(args.top if title == "inclusive" else args.top // 2):
            print(f"{seconds:7.2f} {100 * seconds / total:5.1f}  {frame[:150]}")


if __name__ == "__main__":
    main()
