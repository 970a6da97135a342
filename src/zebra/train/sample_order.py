"""`zebra data order`: which rows of the data each rank reads at each step, in either data order.

Rows number the documents of the recipe's data paths in order (each shard's documents after the previous
shard's; for a convert-fla folder, row i is FLA's Arrow row i, one chunk). The samples come from the same
dataset, sampler and rank split the trainer uses (`zebra.train.data`), so this is what a run reads:
- `fla`: one chunk per sample, the row FLA's own trainer reads at that place (`zebra.data.fla_order`);
- `megatron`: each sample is a `seq_len + 1` token window of megatron's GPTDataset, which may span several
  documents; its rows are the documents it touches, in order.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zebra.train.data import RankBatchSampler, batch_plan, build_datasets, fla_dataset


@dataclass
class OrderReport:
    """`steps[s][r][a]` is rank r's micro-batch a of step s + 1: a row per sample (fla), or a list of rows per
    sample (megatron)."""

    order: str
    data: str
    recipe: str
    ranks: int
    micro_batch: int
    accumulation: int
    global_batch: int
    seq_len: int
    steps: list[list[list[list[Any]]]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_order(
    data: str, recipe_name: str, *, steps: int, ranks: int = 1, overrides: list[str] = ()
) -> OrderReport:
    """The rows each of `ranks` ranks reads in the first `steps` steps of `recipe_name` trained on `data`.

    Raises:
        ZebraError: anything `zebra train` would refuse for this recipe and data (one line).
    """
    from zebra.recipes import load_recipe
    from zebra.recipes.loader import parse_assignments
    from zebra.train.run import resolve_data

    sets = {**parse_assignments(overrides), "data.paths": [data], "data.mock": False}
    recipe = load_recipe(recipe_name, overrides=sets)
    if (
        recipe.data.order == "megatron"
    ):  # megatron's dataset needs the prefixes and the tokenizer; FLA's neither
        resolve_data(recipe)
    G = recipe.train.global_batch_size
    micro, accumulation = batch_plan(G, recipe.train.micro_batch_size, ranks)
    with tempfile.TemporaryDirectory(prefix="zebra-order-") as cache:
        rows_of = _rows_reader(recipe, steps * G, ranks, Path(cache))
        table = []  # [step][rank][micro-batch][sample]
        for s in range(steps):
            table.append([])
            for r in range(ranks):
                sampler = RankBatchSampler(
                    start=s * G, stop=(s + 1) * G, global_batch=G, micro_batch=micro, rank=r, world=ranks
                )
                table[-1].append([[rows_of(g) for g in batch] for batch in sampler])
    return OrderReport(
        order=recipe.data.order,
        data=data,
        recipe=recipe.name,
        ranks=ranks,
        micro_batch=micro,
        accumulation=accumulation,
        global_batch=G,
        seq_len=recipe.data.seq_len,
        steps=table,
    )


def _rows_reader(recipe, samples: int, ranks: int, cache: Path) -> Callable[[int], Any]:
    """global sample -> its row (fla) or rows (megatron)."""
    if recipe.data.order == "fla":
        order = fla_dataset(recipe, samples, ranks=ranks).order
        return lambda g: int(order.rows([g])[0])
    train, _ = build_datasets(recipe, train_samples=samples, valid_samples=0, cache_dir=cache)
    return megatron_rows(train, [path.target for path in recipe.data.paths])


def megatron_rows(dataset: Any, prefixes: list[str]) -> Callable[[int], list[int]]:
    """global sample -> the rows (documents, numbered over `prefixes` in order) megatron's sample reads."""
    from zebra.data.indexed import check_prefix

    first_row, row = {}, 0
    for prefix in prefixes:
        first_row[str(Path(prefix).resolve())] = row
        row += check_prefix(prefix).documents

    def rows(g: int) -> list[int]:
        ds, index = dataset, g
        if hasattr(ds, "dataset_index"):  # a BlendedDataset: which prefix, which of its samples
            ds, index = ds.datasets[int(ds.dataset_index[g])], int(ds.dataset_sample_index[g])
        _, documents = ds._query_document_sample_shuffle_indices(index)  # megatron's own lookup
        base = first_row[str(Path(ds.dataset.path_prefix).resolve())]
        return [base + int(d) for d in documents]

    return rows
