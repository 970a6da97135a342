"""FLA's preprocessing, offline: a text corpus -> the Arrow dataset of token chunks FLA's legacy training reads.

FLA's recipe (`legacy/training/preprocess.py` in flash-linear-attention), with the `datasets` library as it runs it:
1. `dataset.shuffle(seed=42)` over the documents;
2. `dataset.map(batched=True)` (`datasets`' default of 1,000 documents per batch, one process): each batch's
   documents are tokenized (`tokenizer(texts)["input_ids"]`, with BOS if the tokenizer adds one), concatenated
   without EOD and cut into `seq_len` chunks; the batch's last partial chunk is dropped;
3. `save_to_disk` of the `input_ids` column.

`zebra data convert-fla` reads the result; `scripts/build-parity-data.sh` builds the data of the parity run with it.
This stands in for FLA's script where FLA (or the network) is not available; it reads local text through
`zebra data prep`'s sources.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from zebra.core.errors import ZebraError
from zebra.data.fla_order import FLA_SEED

MAP_BATCH = 1000  # documents per `datasets.map` batch (its default, which FLA's preprocess keeps)


@dataclass
class FlaPreprocessResult:
    output: Path
    documents: int
    chunks: int
    tokens: int  # in the chunks (the dropped remainders not counted)


def fla_preprocess(
    source: str | Path,
    tokenizer: str,
    output: str | Path,
    *,
    seq_len: int = 2048,
    text_field: str = "text",
    seed: int = FLA_SEED,
) -> FlaPreprocessResult:
    """Write FLA's chunks of `source` to `output` (`save_to_disk`, written to a temporary folder then renamed).

    Args:
        source: local text files or folders, as `zebra data prep --source` reads them (one document per row).
        tokenizer: an HF tokenizer name or folder, or `byte`.
        output: the Arrow dataset folder (must not exist).
        seq_len: tokens per chunk (FLA's `--context_length`).
        text_field: the field holding each document's text.
        seed: the shuffle seed (FLA's 42).

    Raises:
        ZebraError: `output` exists, the source is not local or holds no text, or no whole chunk results.
    """
    import datasets

    from zebra.data.text_sources import decode_texts, open_source
    from zebra.data.tokenizers import load_tokenizer

    out = Path(output).expanduser()
    if out.exists():
        raise ZebraError(f"{out}: already exists", fix="pass a new output folder, or delete it")
    src = open_source(str(source), text_field=text_field)
    if src.kind != "local":
        raise ZebraError(
            f"{source}: not a local file or folder", fix="download the corpus, then pass its files"
        )
    texts = [t for batch in src.batches() for t in decode_texts(batch)[0]]
    tok = load_tokenizer(tokenizer)

    def chunk(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        stream = list(chain.from_iterable(tok(batch["text"])["input_ids"]))  # no EOD between documents
        whole = len(stream) // seq_len * seq_len
        return {"input_ids": [stream[i : i + seq_len] for i in range(0, whole, seq_len)]}

    docs = datasets.Dataset.from_dict({"text": texts}).shuffle(seed=seed)
    chunks = docs.map(chunk, batched=True, batch_size=MAP_BATCH, remove_columns=["text"])
    if len(chunks) == 0:
        raise ZebraError(
            f"{source}: fewer than {seq_len} tokens", fix="use a larger corpus or a shorter seq_len"
        )
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a killed run's leftovers
    chunks.save_to_disk(str(tmp))
    tmp.replace(out)
    return FlaPreprocessResult(out, len(texts), len(chunks), len(chunks) * seq_len)
