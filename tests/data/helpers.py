"""Helpers for the data tests: write sources in every format, read data folders back."""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_source(kind: str, folder: Path, texts: list[str]) -> Path:
    """The texts as a `kind` source: jsonl, json (array), parquet (two files), arrow (save_to_disk), txt (a file
    per text in two folders, every third gzipped, beside a README.md that is not a document)."""
    rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "txt":
        import gzip

        (folder / "README.md").write_text("# a dataset card, not a document\n")
        for i, text in enumerate(texts):
            path = folder / f"part{i * 2 // len(texts)}" / f"{i:05d}.txt"
            path.parent.mkdir(exist_ok=True)
            data = text.encode("utf-8")
            if i % 3:
                path.write_bytes(data)
            else:
                path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))
        return folder
    if kind == "jsonl":
        return write_jsonl(folder / "docs.jsonl", rows)
    if kind == "json":
        path = folder / "docs.json"
        path.write_text(json.dumps(rows, ensure_ascii=False))
        return path
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        half = len(rows) // 2
        pq.write_table(pa.Table.from_pylist(rows[:half]), folder / "a.parquet", row_group_size=17)
        pq.write_table(pa.Table.from_pylist(rows[half:]), folder / "b.parquet", row_group_size=17)
        return folder
    if kind == "arrow":
        import datasets

        path = folder / "saved"
        datasets.Dataset.from_list(rows).save_to_disk(str(path), num_shards=3)
        return path
    raise ValueError(kind)


def read_all(folder: Path) -> list[list[int]]:
    """Every document of a data folder, through megatron-core's IndexedDataset, in order."""
    from zebra.data.indexed import open_dataset
    from zebra.data.manifest import read_manifest

    docs = []
    for shard in read_manifest(folder).shards:
        ds = open_dataset(folder / shard.prefix)
        docs += [ds[i].tolist() for i in range(len(ds))]
    return docs


def expected_ids(tokenizer_name: str, texts: list[str]) -> list[list[int]]:
    """The tokenizer's own output plus EOD, document by document."""
    from zebra.data.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer_name)
    return [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]


def write_fla_data(
    folder: Path, chunks: list[list[int]], *, rows_per_shard: int = 500_000
) -> tuple[Path, Path]:
    """`chunks` as FLA's preprocess saves them (an Arrow `input_ids` dataset) and converted by `convert-fla`.

    Returns:
        (the Arrow folder, the convert-fla data folder).
    """
    import datasets

    from zebra.data.fla_dataset import convert_fla

    arrow = folder / "arrow"
    datasets.Dataset.from_dict({"input_ids": chunks}).save_to_disk(str(arrow), num_shards=2)
    convert_fla(arrow, folder / "chunks", rows_per_shard=rows_per_shard)
    return arrow, folder / "chunks"
