"""Training data: Megatron `.bin/.idx` prefixes through megatron-core's GPTDataset (blends, train/valid split,
EOD handling), or megatron-core's MockGPTDataset, cut into per-rank micro-batches in a fixed order.

The order is a pure function of the seed and of the sample counts it was built for (`build_train_order`: a
resume with a larger max_steps or global batch extends it, never reorders it): global step `s` reads samples
`[s*G, (s+1)*G)` of the (already shuffled) dataset, so the data position is just `consumed_samples` and a
resumed run reads exactly what an uninterrupted one would. Within a step, micro-batch `a` of rank `r` holds samples
`s*G + a*m*W + r*m + [0, m)` (G global batch, m micro batch, W ranks): any world size sees the same global batch.
With `data.order: fla` the dataset is a convert-fla folder's chunks, and sample `g` is the chunk FLA's own
trainer reads at that place (`zebra.data.fla_order`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.errors import ZebraError
from zebra.data import load_tokenizer

if TYPE_CHECKING:
    import torch

    from zebra.recipes import Recipe
    from zebra.train.dist import DistEnv


@dataclass(frozen=True)
class TokenizerInfo:
    """What megatron's GPT datasets read from a tokenizer: the vocabulary size and the end-of-document id.

    No `pad` attribute: megatron then pads a partial sequence with -1, which no real token collides with.
    """

    name: str
    vocab_size: int
    eod: int

    @property
    def unique_identifiers(self) -> dict[str, Any]:  # part of megatron's dataset cache key
        return {"class": "zebra.TokenizerInfo", "name": self.name, "vocab_size": self.vocab_size}


def tokenizer_info(recipe: Recipe) -> TokenizerInfo:
    """The recipe's tokenizer as megatron needs it; mock data needs no tokenizer (EOD 0, the model's vocab)."""
    if recipe.data.mock:
        return TokenizerInfo(name="mock", vocab_size=recipe.model.vocab_size, eod=0)
    tok = load_tokenizer(recipe.data.tokenizer)
    eod = tok.eos_token_id
    if eod is None:
        raise ZebraError(
            f"data.tokenizer {recipe.data.tokenizer!r} has no end-of-text token",
            fix="use a tokenizer with an eos token (documents are separated by it)",
        )
    return TokenizerInfo(name=recipe.data.tokenizer, vocab_size=len(tok), eod=int(eod))


@contextlib.contextmanager
def _quiet_megatron():
    """megatron-core warns about missing Transformer Engine / Apex on import and logs every index it builds."""
    logging.getLogger("megatron").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="megatron")
        warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
        yield


@contextlib.contextmanager
def _megatron_process_group():
    """megatron-core's BlendedDataset asks for the rank even in a single process: give it a world of one."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def build_datasets(
    recipe: Recipe, *, train_samples: int, valid_samples: int, cache_dir: Path, part: int = 0
) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset | None]:
    """The train and validation datasets (megatron GPTDataset / BlendedDataset / MockGPTDataset).

    Collective when a process group exists: rank 0 builds the index files in `cache_dir`, the others read them.

    Args:
        train_samples: sequences the run will read (max_steps x global batch).
        valid_samples: sequences one validation pass reads (0: no validation set).
        part: 0, or the extension of a run's data order that this is (shuffled with train.seed + part; see
            `build_train_order`).
    """
    if recipe.data.order == "fla" and not recipe.data.mock:
        return fla_dataset(recipe, train_samples), None  # FLA trains on every chunk: no validation split
    with _quiet_megatron(), _megatron_process_group():
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

        info = tokenizer_info(recipe)
        blend = None
        if not recipe.data.mock:
            pairs = recipe.data.paths  # DataPath(prefix, weight)s, resolved by `zebra.train.run.resolve_data`
            if not pairs:
                raise ZebraError(
                    "no training data (data.paths is empty)", fix="pass --data PREFIX or --mock-data"
                )
            for prefix, _ in pairs:
                for ext in (".bin", ".idx"):
                    if not Path(prefix + ext).is_file():
                        raise ZebraError(
                            f"data.paths: {prefix}{ext} not found",
                            fix="pass a Megatron prefix (PREFIX.bin + PREFIX.idx) made by `zebra data prep`",
                        )
            weights = [w for _, w in pairs]
            blend = ([p for p, _ in pairs], weights if len(pairs) > 1 else None)
        config = GPTDatasetConfig(
            random_seed=recipe.train.seed + part,
            sequence_length=recipe.data.seq_len,
            blend=blend,
            split=None if recipe.data.mock else recipe.data.split,
            path_to_cache=str(cache_dir),
            tokenizer=info,
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
        )
        cls = MockGPTDataset if recipe.data.mock else GPTDataset
        sizes = [train_samples, max(valid_samples, 1), 1]  # a weighted blend needs a size for every split
        if blend is not None:
            check_split_documents(recipe, blend[0], eval_on=valid_samples > 0)
        try:
            train, valid, _ = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()
        except (AssertionError, ValueError, IndexError) as e:
            # a save of megatron's index cut short by a kill or a full disk
            if (broken := broken_index_cache(cache_dir)) is not None:
                raise ZebraError(
                    f"{broken}: megatron's cached index is cut short or broken ({e or type(e).__name__})",
                    fix=f"delete {cache_dir} (megatron builds it again from the data)",
                ) from None
            raise ZebraError(
                f"megatron could not build the dataset from {[str(p) for p in recipe.data.paths]}: {e or type(e).__name__}",
                fix="check data.split and that each prefix holds enough tokens for one sequence",
            ) from None
    if valid is not None and (valid_samples == 0 or len(valid) == 0):
        valid = None
    return train, valid


def broken_index_cache(cache_dir: str | Path) -> Path | None:
    """The first of megatron's cached index arrays (`*.npy`) in `cache_dir` that numpy cannot map, or None."""
    import numpy as np

    for path in sorted(Path(cache_dir).glob("*.npy")):
        try:
            np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return path
    return None


def split_bounds(split: str) -> list[tuple[float, float] | None]:
    """`data.split` ("99,1,0") as megatron's split matrix: the [start, end) fraction of each prefix's documents that
    training, validation and test take, None for a part with no weight (megatron then builds no dataset for it).

    >>> split_bounds("3,1,0")
    [(0.0, 0.75), (0.75, 1.0), None]
    """
    weights = [float(w) for w in split.split(",")]
    total = sum(weights)
    bounds: list[tuple[float, float] | None] = []
    start = 0.0
    for weight in weights:
        end = start + weight / total
        bounds.append((start, end) if end > start else None)
        start = end
    return bounds


def check_split_documents(
    recipe: Recipe, prefixes: list[str], *, eval_on: bool, documents: dict[str, int] | None = None
) -> None:
    """Refuse a data.split that gives training no documents, or a prefix no documents in its train or validation
    part: megatron would try to draw samples from none and loop forever (it cuts each prefix's documents at
    round(fraction x count)). Reads only the prefixes' .idx headers, so it runs before a run folder exists;
    `documents` gives the counts of prefixes not written yet (a dry run's `@sample`)."""
    from zebra.data.indexed import check_prefix

    split_matrix = split_bounds(recipe.data.split)
    if split_matrix[0] is None:
        raise ZebraError(
            f"data.split {recipe.data.split!r} leaves no documents for training",
            fix="give the first (train) weight of data.split a share, e.g. --set data.split=99,1,0",
        )
    for prefix in prefixes:
        count = documents[prefix] if documents and prefix in documents else check_prefix(prefix).documents
        for part, bounds in zip(("training", "validation"), split_matrix[:2], strict=True):
            if bounds is None or round(bounds[0] * count) < round(bounds[1] * count):
                continue
            fix = (
                "give it a larger share, e.g. --set data.split=90,10,0"
                if part == "validation" and eval_on
                else "--set data.split=100,0,0 (with train.eval_interval=0), or more documents"
            )
            raise ZebraError(
                f"data.split {recipe.data.split!r} leaves no documents for {part} in {prefix} ({count} documents)",
                fix=fix,
            )


def fla_dataset(recipe: Recipe, samples: int, *, ranks: int | None = None) -> torch.utils.data.Dataset:
    """`data.order: fla`: `samples` samples of the recipe's convert-fla folder in FLA's order for `ranks`
    data-parallel ranks (default: this process group's size), with the micro batch `batch_plan` gives them."""
    import torch.distributed as dist

    from zebra.data.fla_order import FlaChunkDataset, FlaOrder, fla_folder

    world = ranks or (dist.get_world_size() if dist.is_initialized() else 1)
    micro, accumulation = batch_plan(recipe.train.global_batch_size, recipe.train.micro_batch_size, world)
    folder = fla_folder(recipe.data.paths, recipe.data.seq_len, recipe.train.global_batch_size)
    return FlaChunkDataset(folder, FlaOrder(folder.chunks, world, micro, accumulation), samples)


def build_train_order(
    recipe: Recipe, *, parts: list[int], stop: int, valid_samples: int, cache_dir: Path
) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset | None, list[int]]:
    """The run's training samples in their order (at least `stop` of them), the validation set, and `parts`.

    A run's order is fixed by the sample count it is first built for: megatron shuffles over all the epochs
    that count needs, so building it for another count (a larger max_steps or global batch on resume) would
    reorder the samples already trained on. `parts` are the sample counts of the order so far (saved in each
    checkpoint; empty for a new run: `[stop]`). A run that needs more samples than they give gets one more
    part, built for the missing samples with train.seed + its index and appended: the unread samples of the
    first part's last epoch come first, then new epochs. (A weighted blend is cut to its sample count, so its
    extension starts a new shuffle at once.) FLA's order (`data.order: fla`) depends on the position alone, so it is
    simply built for `stop` samples.
    """
    from torch.utils.data import ConcatDataset

    if recipe.data.order == "fla" and not recipe.data.mock:
        return fla_dataset(recipe, stop), None, [stop]  # FLA's order is a function of the position alone
    parts = list(parts) or [stop]
    train, valid = build_datasets(
        recipe, train_samples=parts[0], valid_samples=valid_samples, cache_dir=cache_dir
    )
    pieces = [train]
    while len(pieces) < len(parts) or sum(len(d) for d in pieces) < stop:
        if len(pieces) == len(parts):
            parts.append(stop - sum(len(d) for d in pieces))
        extra, _ = build_datasets(
            recipe, train_samples=parts[len(pieces)], valid_samples=0, cache_dir=cache_dir, part=len(pieces)
        )
        pieces.append(extra)
    return (train if len(pieces) == 1 else ConcatDataset(pieces)), valid, parts


def batch_plan(global_batch: int, micro_batch: int, world_size: int) -> tuple[int, int]:
    """(micro batch, accumulation steps) with micro x ranks x accumulation = global batch.

    The micro batch is the recipe's, or the largest smaller one that divides a rank's share of the global
    batch (a smaller micro batch never needs more memory). Raises ZebraError when the ranks cannot share it.
    """
    if global_batch % world_size:
        raise ZebraError(
            f"train.global_batch_size {global_batch} does not split over {world_size} ranks",
            fix=f"use a multiple of {world_size} (e.g. --set train.global_batch_size="
            f"{max(world_size, global_batch // world_size * world_size)}) or another rank count",
        )
    per_rank = global_batch // world_size
    micro = next(d for d in range(min(micro_batch, per_rank), 0, -1) if per_rank % d == 0)
    return micro, per_rank // micro


class RankBatchSampler:
    """Index lists of this rank's micro-batches from global sample `start` on, step after step."""

    def __init__(self, *, start: int, stop: int, global_batch: int, micro_batch: int, rank: int, world: int):
        self.start, self.stop = start, stop
        self.global_batch, self.micro_batch, self.rank, self.world = global_batch, micro_batch, rank, world

    def __iter__(self) -> Iterator[list[int]]:
        m, w = self.micro_batch, self.world
        for step_start in range(self.start, self.stop - self.global_batch + 1, self.global_batch):
            for pass_start in range(step_start, step_start + self.global_batch, m * w):
                first = pass_start + self.rank * m
                yield list(range(first, first + m))

    def __len__(self) -> int:
        steps = max(0, (self.stop - self.start) // self.global_batch)
        return steps * self.global_batch // (self.micro_batch * self.world)


def _collate(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    import torch

    return {
        "tokens": torch.stack([s["tokens"] for s in samples]),  # [m, T]
        "labels": torch.stack([s["labels"] for s in samples]),  # [m, T] next tokens
        "loss_mask": torch.stack([s["loss_mask"] for s in samples]),  # [m, T] 0 on padding
    }


def micro_batches(
    dataset: torch.utils.data.Dataset,
    *,
    start: int,
    stop: int,
    global_batch: int,
    micro_batch: int,
    env: DistEnv,
    num_workers: int,
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's micro-batches (`tokens`, `labels`, `loss_mask`, each [m, T]) for samples [start, stop)."""
    import torch

    sampler = RankBatchSampler(
        start=start,
        stop=stop,
        global_batch=global_batch,
        micro_batch=micro_batch,
        rank=env.rank,
        world=env.world_size,
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=_collate,
        pin_memory=env.device.type == "cuda",
        prefetch_factor=4 if num_workers else None,
    )
    return iter(loader)
