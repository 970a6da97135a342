"""The checkpoints folder is read below both train/ and convert/: reading a run's checkpoints for conversion
loads no training code (which itself loads conversion code for its export: an import cycle otherwise)."""

from __future__ import annotations

import subprocess
import sys


def test_convert_formats_loads_no_training_module_and_checkpoint_dir_no_torch():
    script = (
        "import sys, zebra.checkpoint_dir\n"
        "print('torch' in sys.modules)\n"
        "import zebra.convert.formats\n"
        "print(sorted(m for m in sys.modules if m.startswith('zebra.train')))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert run.stdout.split("\n")[:2] == ["False", "[]"]
