"""Held-out CE (nats/token) of models on a folder made by scripts/pack-corpus.py, measured as
scripts/distill-figure.py measures it: the first COUNT windows of SEQ + 1 tokens of the pack's held-out documents
(32 x 2048 on a GPU, in bf16 autocast; 2 x 64 on the CPU, float32). Each MODEL is a Zebra export folder or the
teacher's GGUF / HF folder; one JSON line each.

    python3 scripts/heldout-ce.py /tmp/pack/data SmolLM2-135M-Instruct.Q4_1.gguf runs/hybrid
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path


def main() -> None:
    import torch

    from zebra.eval.ce import heldout_ce

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="a folder of scripts/pack-corpus.py (pack.json)")
    p.add_argument("models", nargs="+", help="Zebra export folders, or a teacher (a .gguf or an HF folder)")
    p.add_argument("--seq", type=int, help="tokens per window (2048 on a GPU, 64 on the CPU)")
    p.add_argument("--count", type=int, help="windows (32 on a GPU, 2 on the CPU)")
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("figure", Path(__file__).with_name("distill-figure.py"))
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seq, count = (2048, 32) if device.type == "cuda" else (64, 2)
    windows = figure.heldout_windows(
        args.data, figure.pack_info(args.data), args.seq or seq, args.count or count
    )
    for path in args.models:
        if _is_zebra(path):
            model = figure.load_export(path, device)
        else:
            from zebra.upcycle import open_teacher
            from zebra.upcycle.teachers.causal_lm import build_teacher_model

            model = build_teacher_model(open_teacher(path), torch.float32).to(device)
        print(
            json.dumps(
                {"model": path, "heldout_ce": heldout_ce(model, windows, device, device.type == "cuda")}
            ),
            flush=True,
        )


def _is_zebra(path: str) -> bool:
    """A Zebra export folder (its config.json says model_type zebra), not a teacher."""
    from zebra.folders.model_folder import config_model_type

    return config_model_type(Path(path)) == "zebra"


if __name__ == "__main__":
    main()
