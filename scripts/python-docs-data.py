"""Tokenized Python documentation for the upcycling figure: train and held-out Megatron prefixes in a teacher's
tokenizer (by default SmolLM2's, read from its GGUF). Runs on any CPU machine; carry OUT to the GPU machine.

    python3 scripts/python-docs-data.py SmolLM2-135M-Instruct.Q4_1.gguf data/
    # -> data/tokenizer/ (the teacher's tokenizer), data/text/{train,heldout}.jsonl, data/train/, data/heldout/

Needs Debian's python3.11-doc (the HTML pages, zebra.data.python_docs); pages are split by the hash of their path
(10% held out), so the split is the same everywhere.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    from zebra.data.prep import plan_prep, run_prep
    from zebra.data.python_docs import write_python_docs_corpus
    from zebra.data.text_sources import open_source
    from zebra.upcycle import open_teacher

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("teacher", help="the model whose tokenizer to use (.gguf, HF folder or hub id)")
    p.add_argument("output", type=Path)
    p.add_argument("--heldout-fraction", type=float, default=0.1)
    p.add_argument("--max-docs", type=int, default=None, help="stop after this many pages (default: all)")
    args = p.parse_args()
    teacher = open_teacher(args.teacher)
    teacher.tensors.close()
    tokenizer = args.output / "tokenizer"
    teacher.tokenizer.save_pretrained(tokenizer)
    counts = write_python_docs_corpus(
        args.output / "text", heldout_fraction=args.heldout_fraction, max_docs=args.max_docs
    )
    print(f"text: {counts}")
    for split in ("train", "heldout"):
        source = open_source(str(args.output / "text" / f"{split}.jsonl"))
        result = run_prep(plan_prep(source, args.output / split, tokenizer=str(tokenizer), force=True))
        print(f"{split}: {result.folder} ({result.manifest.tokens:,} tokens)")


if __name__ == "__main__":
    main()
