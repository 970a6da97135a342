#!/usr/bin/env bash
# The data of the FLA parity run (`zebra bench parity`, issue 20), built offline on a CPU machine:
#   1. real prose: every page of Debian's python3.11-doc as plain text (`zebra.data.python_docs`);
#   2. a byte-level BPE of $VOCAB ids trained on that text with `tokenizers` (Llama-3's split; no network);
#   3. FLA's preprocessing (`zebra.data.fla_preprocess`): shuffle(seed=42), tokenize, concatenate without EOD,
#      $SEQ_LEN-token chunks, saved as FLA's Arrow dataset;
#   4. `zebra data convert-fla` of those chunks: the data folder the parity run reads in FLA's order.
# OUT (default data/parity-python-docs, about 26 MB) then holds tokenizer/, arrow/ and chunks/; carry it to the GPU
# and run there, for example:
#   zebra bench parity 1b-gdn-pure --data OUT/chunks --steps 250 --batch 4 --set model.vocab_size=16384 \
#     --output OUT/bf16
#   zebra bench parity 1b-gdn-pure --data OUT/chunks --steps 5 --batch 4 --set model.vocab_size=16384 \
#     --set train.precision=fp32 --output OUT/fp32
# Needs: apt-get install -y python3.11-doc.   Usage: scripts/build-parity-data.sh [OUT]
set -euo pipefail
OUT=${1:-data/parity-python-docs}
python3 -c "import zebra.data.python_docs" 2>/dev/null || {
  echo "error: zebra.data.python_docs (the python3.11-doc corpus reader, from the upcycle branch) is not installed" >&2
  exit 1
}
VOCAB=${VOCAB:-16384}
SEQ_LEN=${SEQ_LEN:-2048}
rm -rf "$OUT"
mkdir -p "$OUT"
python3 - "$OUT" "$VOCAB" "$SEQ_LEN" <<'PY'
import json
import sys
from pathlib import Path

from zebra.data.fla_preprocess import fla_preprocess
from zebra.data.python_docs import write_python_docs_corpus
from zebra.data.tokenizers import train_bpe

out, vocab, seq_len = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
counts = write_python_docs_corpus(out / "corpus", heldout_fraction=0.1)  # both splits are used: no evaluation here
print(f"corpus: {counts}")
texts = [json.loads(line)["text"] for f in sorted((out / "corpus").glob("*.jsonl")) for line in f.open()]
train_bpe(texts, vocab, split="llama3").save_pretrained(out / "tokenizer")
result = fla_preprocess(out / "corpus", str(out / "tokenizer"), out / "arrow", seq_len=seq_len)
print(f"FLA chunks: {result.documents} documents -> {result.chunks} chunks of {seq_len} ({result.tokens:,} tokens)")
PY
python3 -m zebra.cli.main data convert-fla "$OUT/arrow" --output "$OUT/chunks" --tokenizer "$OUT/tokenizer"
rm -rf "$OUT/corpus"  # rebuilt from the installed docs in seconds; the chunks are what the run reads
du -sh "$OUT"/*
