"""Pack a token slice of a `zebra data corpus` folder for a machine that takes files of at most ~60 MiB a call.

Writes OUT/data/, one prepared folder (`data_00000.bin/.idx`, manifest.json in the corpus's tokenizer, pack.json):
whole training documents, drawn in a fixed shuffled order (seed 0, so every source is represented) until
--train-tokens are reached, then whole held-out documents until --heldout-tokens. pack.json records the two
document counts: `zebra train` / `zebra distill` with `--set data.split=TRAIN_DOCS,HELDOUT_DOCS,0` then validate on
exactly the corpus's held-out documents (megatron-core splits a dataset by document counts in that proportion), and
scripts/distill-figure.py reads it to do so. With --archive PREFIX the folder is also written as
PREFIX.tar.xz.00, .01, ... (tar, xz -6, split into parts of --part-mib MiB), and the unpack command is printed; it
needs only Python's standard library (the GPU machine has no zstd module):

    cat PREFIX.tar.xz.* | python3 -c "import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.stdin.buffer), mode='r|').extractall(sys.argv[1])" DEST

Compression of SmolLM2 uint16 tokens of this corpus (the first 20 MB of train tokens, 2026-12-06): zstd -19 2.60x
(35 s), zstd --ultra -22 2.61x (64 s). xz -6 is used because Python's standard library unpacks it (the GPU machine
has no zstd module). Measured here, 2026-12-06: 50M train + 1M held-out tokens (11,806 + 247 documents, 102 MB)
and the teacher's GGUF (98 MB) made 113.7 MiB of xz in 3 parts of at most 40 MiB (35 minutes on the shared 2-core
CPU at load 20; zstd -19 made 115 MiB). A GPU call carries 64 MiB with the checkout (about 4 MB), so a part fits
beside the 17 MB of wheels of the first call.

    python3 scripts/pack-corpus.py /work/corpus --train-tokens 50M --heldout-tokens 1M -o pack/ --archive pack/smol50m --include SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

SEED = 0
UNPACK = "import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.stdin.buffer), mode='r|').extractall(sys.argv[1])"


def parse_count(text: str) -> int:
    scale = {"k": 10**3, "m": 10**6, "b": 10**9}.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def pick_documents(prefix: Path, tokens: int) -> tuple[object, list[int]]:
    """(the dataset, document indices in a fixed shuffled order up to `tokens` tokens)."""
    import numpy as np

    from zebra.data.indexed import open_dataset

    dataset = open_dataset(str(prefix))
    lengths = dataset.sequence_lengths
    order = np.random.default_rng(SEED).permutation(len(lengths))
    picked, total = [], 0
    for i in order.tolist():
        if total >= tokens:
            break
        picked.append(i)
        total += int(lengths[i])
    if total < tokens:
        raise SystemExit(f"{prefix}: {total:,} tokens, fewer than the {tokens:,} asked for")
    return dataset, sorted(picked)


def write_pack(corpus: Path, train_tokens: int, heldout_tokens: int, out: Path) -> dict:
    """OUT/data: the train documents then the held-out ones, one shard, manifest + pack.json. Returns pack.json."""
    import numpy as np

    from zebra.data.indexed import ShardWriter
    from zebra.data.manifest import Shard, read_manifest, write_manifest

    folder = out / "data"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    manifest = read_manifest(corpus / "train")
    writer = ShardWriter(folder / "data_00000", np.dtype(manifest.dtype))
    counts = {}
    for split, want in (("train", train_tokens), ("heldout", heldout_tokens)):
        dataset, picked = pick_documents(corpus / split / f"{split}_00000", want)
        for i in picked:
            doc = np.asarray(dataset[i], dtype=manifest.dtype)
            writer.add_documents(doc, np.array([len(doc)]))
        counts[split] = len(picked)
    tokens = writer.tokens
    info = writer.finish()
    writer.commit()
    manifest.shards = [Shard(prefix="data_00000", first_row=0, rows=writer.documents, documents=writer.documents,
                             tokens=tokens, bytes=0, skipped={}, **info)]  # fmt: skip
    manifest.source = {"kind": "pack", "name": str(corpus), "seed": SEED}
    manifest.complete = True
    write_manifest(folder, manifest)
    pack = {"train_documents": counts["train"], "heldout_documents": counts["heldout"], "tokens": tokens,
            "train_tokens_asked": train_tokens, "heldout_tokens_asked": heldout_tokens,
            "split": f"{counts['train']},{counts['heldout']},0"}  # fmt: skip
    (folder / "pack.json").write_text(json.dumps(pack, indent=1) + "\n")
    return pack


def archive(out: Path, prefix: Path, part_mib: int, include: list[Path]) -> list[Path]:
    """tar | xz -6 | split of OUT/data (and the `include` files, by name, beside it) into PREFIX.tar.xz.NN
    parts of at most `part_mib` MiB."""
    for old in prefix.parent.glob(prefix.name + ".tar.xz.*"):
        old.unlink()
    for extra in include:
        shutil.copyfile(extra, out / extra.name)
    names = ["data", *(extra.name for extra in include)]
    tar = subprocess.Popen(["tar", "-c", "-C", str(out), *names], stdout=subprocess.PIPE)
    xz = subprocess.Popen(["xz", "-6", "-T0", "-q", "-c"], stdin=tar.stdout, stdout=subprocess.PIPE)
    tar.stdout.close()
    split = ["split", "-b", f"{part_mib}M", "-d", "-", f"{prefix}.tar.xz."]
    subprocess.run(split, stdin=xz.stdout, check=True)
    if xz.wait() or tar.wait():
        raise SystemExit("tar | xz failed")
    return sorted(prefix.parent.glob(prefix.name + ".tar.xz.*"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("corpus", type=Path, help="a `zebra data corpus` folder (train/, heldout/)")
    p.add_argument("--train-tokens", default="50M")
    p.add_argument("--heldout-tokens", default="1M")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--archive", type=Path, help="also write PREFIX.tar.xz.NN parts")
    p.add_argument("--part-mib", type=int, default=40)
    p.add_argument(
        "--include",
        type=Path,
        action="append",
        default=[],
        help="a file to put into the archive beside data/ (the teacher's GGUF: one carry for both)",
    )
    args = p.parse_args()
    pack = write_pack(
        args.corpus, parse_count(args.train_tokens), parse_count(args.heldout_tokens), args.output
    )
    print(f"{args.output / 'data'}: {pack['train_documents']:,} train + {pack['heldout_documents']:,} held-out "
          f"documents, {pack['tokens']:,} tokens; validate with --set data.split={pack['split']}")  # fmt: skip
    if args.archive:
        args.archive.parent.mkdir(parents=True, exist_ok=True)
        parts = archive(args.output, args.archive, args.part_mib, args.include)
        for part in parts:
            print(f"{part}: {part.stat().st_size / 2**20:.1f} MiB")
        print(
            f'unpack (DEST/data/ and the includes): cat {args.archive.name}.tar.xz.* | python3 -c "{UNPACK}" DEST'
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
