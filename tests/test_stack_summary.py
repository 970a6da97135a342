"""scripts/stack-summary.py on py-spy's raw format: seconds per frame for the main thread, other threads apart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "stack-summary.py"

STACKS = """\
_run_module_as_main (<frozen runpy>:198);main (zebra/cli/main.py:104);build_model (zebra/train/trainer.py:155) 300
_run_module_as_main (<frozen runpy>:198);main (zebra/cli/main.py:104);step (zebra/train/step.py:150) 100
_run_module_as_main (<frozen runpy>:198);main (zebra/cli/main.py:104);step (zebra/train/step.py:162) 50
Thread._bootstrap (threading.py:1002);Condition.wait (threading.py:331) 400
"""


def test_stack_summary_sums_the_main_threads_samples_per_function(tmp_path):
    (tmp_path / "stacks.txt").write_text(STACKS)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "stacks.txt"), "--rate", "100"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "main thread: 4.5 s sampled (other threads: 4.0 s)"
    start = next(i for i, line in enumerate(lines) if line.endswith("inclusive")) + 1
    inclusive = lines[start : lines.index("", start)]
    rows = {m[3]: m[1] for m in (re.match(r"\s*([\d.]+)\s+([\d.]+)\s+(.*)", line) for line in inclusive)}
    assert rows["main (zebra/cli/main.py)"] == "4.50"
    assert rows["build_model (zebra/train/trainer.py)"] == "3.00"
    assert rows["step (zebra/train/step.py)"] == "1.50"  # two lines of one function, one frame
    assert not any("Condition.wait" in frame for frame in rows)
