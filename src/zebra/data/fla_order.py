"""`data.order: fla`: FLA's chunks, one per sample, in the order FLA's legacy training reads them.

A folder written by `zebra data convert-fla` holds FLA's fixed-length chunks as Megatron documents, row `i` of
FLA's Arrow data being document `i`. FLA's legacy trainer (an HF `Trainer` over that Arrow dataset) reads them so:

1. `dataset.shuffle(seed=42)`: `datasets` draws `numpy.random.default_rng(42).permutation(N)`; row `k` of the
   shuffled dataset is chunk `shuffled[k]`.
2. A `DistributedSampler(shuffle=True, seed=42)` per epoch `e`: `perm_e = torch.randperm(N)` from a generator seeded
   with `42 + e`, padded to a multiple of the data-parallel ranks D by repeating its start
   (`padded[p] = perm_e[p % N]`); rank r takes `padded[r::D]`.
3. A DataLoader cuts each rank's list into micro-batches of M, and the Trainer accumulates A of them per step.

So rank r, at micro-step `t = s*A + a` (optimizer step s, accumulation a) of an epoch, position j of its
micro-batch, reads sampler position `p = r + (t*M + j)*D`, that is chunk `shuffled[perm_e[p % N]]`.

Zebra's trainer numbers the samples of a step the other way round (`zebra.train.data`): rank r's micro-batch a
of step s holds global samples `g = s*G + a*M*D + r*M + j` (G = M*D*A). `FlaOrder.rows(g)` maps those numbers
onto FLA's positions above, so the trainer's sampler, resume position (`consumed_samples`) and accumulation are
unchanged and every rank reads exactly FLA's chunks. Both layouts give each optimizer step the same set of chunks
(sampler positions `[s*G, (s+1)*G)`), so only the rank a chunk lands on depends on the mapping.

An epoch ends after its last whole optimizer step (`steps_per_epoch`); FLA's Trainer ends it with one shorter
step over the remaining micro-batches, which a fixed global batch cannot hold, so those (< G) chunks are skipped
and the next step starts epoch `e + 1`. A one-epoch run, the parity runs among them, never reaches this.

Each sample is one chunk: `tokens` = its seq_len ids, `labels` = the same ids shifted by one inside the chunk,
and the last position has no target (`loss_mask` 0), as FLA's model scores a chunk (no EOD, no re-windowing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.errors import ZebraError
from zebra.data.manifest import Manifest, read_manifest
from zebra.data.paths import BUNDLED, DataPath, prep_folder

if TYPE_CHECKING:
    import numpy as np
    import torch

FLA_SEED = 42  # FLA's legacy training `--seed` default: its dataset shuffle and its sampler's seed
_FIX_KIND = "convert FLA's preprocessed Arrow data with `zebra data convert-fla`, or use data.order: megatron"


@dataclass(frozen=True)
class FlaFolder:
    """A convert-fla data folder whose chunks all hold `seq_len` tokens."""

    path: Path
    manifest: Manifest
    seq_len: int

    @property
    def chunks(self) -> int:
        return self.manifest.documents

    @property
    def prefixes(self) -> list[Path]:
        """The shards' Megatron prefixes, in chunk order."""
        return [self.path / s.prefix for s in self.manifest.shards]


def fla_folder(paths: list[DataPath], seq_len: int, global_batch: int) -> FlaFolder:
    """The one convert-fla folder `data.paths` names, checked for `data.order: fla`.

    Args:
        paths: `data.paths` as the recipe has it (one folder), or as the trainer resolved it (that folder's
            shard prefixes, each with its weight).
        seq_len: `data.seq_len`; every chunk must hold exactly this many tokens.
        global_batch: `train.global_batch_size`; an epoch must hold at least one step.

    Raises:
        ZebraError: no path, several data sets, a folder `convert-fla` did not write, an unfinished folder,
            chunks of another length, or fewer chunks than one global batch.
    """
    if not paths:
        raise ZebraError(
            "data.order fla: data.paths is empty", fix="pass --data FOLDER (a convert-fla folder)"
        )
    named: dict[Path, set[str]] = {}  # folder -> the shard prefixes named (empty: the folder itself)
    for entry in paths:
        folder, shard = _folder_of(entry.target)
        named.setdefault(folder, set()).update([shard] if shard else [])
    if len(named) != 1:
        raise ZebraError(
            f"data.order fla: data.paths names {len(named)} data sets; FLA's order is defined over one",
            fix="pass one folder written by `zebra data convert-fla`",
        )
    folder, shards = named.popitem()
    if shards and shards != {s.prefix for s in read_manifest(folder).shards if s.tokens}:
        raise ZebraError(
            f"data.order fla: data.paths names some shards of {folder}; FLA's order is over all its chunks",
            fix=f"pass the folder itself: --data {folder}",
        )
    manifest = read_manifest(folder)
    kind = manifest.config.get("kind")
    if kind != "convert-fla":
        raise ZebraError(
            f"data.order fla: {folder} was written by `zebra data {kind}`, not convert-fla "
            "(its documents are not FLA's chunks)",
            fix=_FIX_KIND,
        )
    if not manifest.complete:
        raise ZebraError(
            f"data.order fla: {folder}: convert-fla did not finish",
            fix="re-run the same `zebra data convert-fla` command: it resumes",
        )
    _check_chunk_lengths(folder, manifest, seq_len)
    if manifest.documents < global_batch:
        raise ZebraError(
            f"data.order fla: {folder} holds {manifest.documents} chunks, fewer than one global batch "
            f"({global_batch})",
            fix="lower train.global_batch_size, or convert more data",
        )
    return FlaFolder(folder, manifest, seq_len)


def _folder_of(target: str) -> tuple[Path, str | None]:
    """(data folder, None) for a folder (or its manifest.json), (data folder, shard prefix) for one of its
    shards (as the trainer resolves a folder)."""
    if target == BUNDLED:
        raise ZebraError(f"data.order fla: {BUNDLED} is not FLA data (it has no chunks)", fix=_FIX_KIND)
    folder = prep_folder(target)
    if folder is not None:
        return folder.resolve(), None
    path = Path(target).expanduser()
    folder = prep_folder(path.parent)
    if folder is None or path.name not in {s.prefix for s in read_manifest(folder).shards}:
        raise ZebraError(
            f"data.order fla: {target} is not a data folder (FLA's chunks come as a convert-fla folder)",
            fix=_FIX_KIND,
        )
    return folder.resolve(), path.name


def _check_chunk_lengths(folder: Path, manifest: Manifest, seq_len: int) -> None:
    """Every chunk holds `seq_len` tokens (read from the shards' indexes, not trusted from the manifest)."""
    import numpy as np

    from zebra.data.indexed import open_dataset

    for shard in manifest.shards:
        shard_data = open_dataset(folder / shard.prefix)
        lengths = np.array(shard_data.sequence_lengths)  # [documents]; a copy: the memory map closes with it
        wrong = lengths[lengths != seq_len]
        if wrong.size:
            found = int(np.bincount(lengths).argmax())
            raise ZebraError(
                f"data.order fla: {folder} holds {found}-token chunks, but data.seq_len is {seq_len}",
                fix=f"--set data.seq_len={found} (FLA trains on whole chunks)",
            )


@dataclass
class FlaOrder:
    """FLA's order of `chunks` chunks for `ranks` data-parallel ranks, micro-batch `micro`, `accumulation` steps.

    `rows(g)` is the chunk that zebra's global sample `g` reads (see the module docstring for the mapping).
    """

    chunks: int
    ranks: int
    micro: int
    accumulation: int
    seed: int = FLA_SEED
    _perms: dict[int, Any] = field(default_factory=dict, repr=False)  # epoch -> torch.randperm [N]
    _shuffled: Any = field(default=None, repr=False)  # datasets' shuffle [N]

    def __post_init__(self) -> None:
        assert self.steps_per_epoch > 0, "fla_folder refuses data smaller than one global batch"

    @property
    def global_batch(self) -> int:
        return self.micro * self.ranks * self.accumulation

    @property
    def steps_per_epoch(self) -> int:
        """Whole optimizer steps per epoch: each rank's `ceil(N / D)` chunks in full micro-batches of M."""
        per_rank = -(-self.chunks // self.ranks)
        return per_rank // self.micro // self.accumulation

    def positions(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(epoch, sampler position p) of zebra's global sample numbers `samples` [n]."""
        m, D, A, G = self.micro, self.ranks, self.accumulation, self.global_batch
        epoch, within = divmod(samples, self.steps_per_epoch * G)
        step, in_step = divmod(within, G)
        a, in_pass = divmod(in_step, m * D)  # zebra: g = s*G + a*m*D + r*m + j
        rank, j = divmod(in_pass, m)
        return epoch, rank + ((step * A + a) * m + j) * D  # FLA: p = r + (t*M + j)*D, t = s*A + a

    def rows(self, samples: Any) -> np.ndarray:
        """The chunk (row of the convert-fla folder) each of zebra's global samples `samples` reads."""
        import numpy as np

        epoch, position = self.positions(np.asarray(samples, dtype=np.int64))
        rows = np.empty(position.shape, dtype=np.int64)
        for e in np.unique(epoch).tolist():
            here = epoch == e
            rows[here] = self.shuffled[self.permutation(e)[position[here] % self.chunks]]
        return rows

    @property
    def shuffled(self) -> np.ndarray:
        """`datasets.Dataset.shuffle(seed)`'s row permutation: numpy's default generator (PCG64)."""
        import numpy as np

        if self._shuffled is None:
            self._shuffled = np.random.default_rng(self.seed).permutation(self.chunks)
        return self._shuffled

    def permutation(self, epoch: int) -> np.ndarray:
        """The sampler's `torch.randperm(N)` for `epoch` (generator seeded with seed + epoch)."""
        import torch

        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            self._perms[epoch] = torch.randperm(self.chunks, generator=gen).numpy()
        return self._perms[epoch]


class FlaChunkDataset:
    """Zebra's global sample `g` -> FLA's chunk for it, as the trainer's samples (`tokens`, `labels`,
    `loss_mask`, each [T]); a map-style dataset of `samples` samples for `torch.utils.data.DataLoader`.

    The shards are memory-mapped on first use in each process (DataLoader workers open their own).
    """

    def __init__(self, folder: FlaFolder, order: FlaOrder, samples: int) -> None:
        import numpy as np

        self.folder, self.order, self.samples = folder, order, samples
        counts = [s.documents for s in folder.manifest.shards]
        self._starts = np.cumsum([0, *counts])  # first chunk of each shard
        self._shards: list[Any] | None = None

    def __len__(self) -> int:
        return self.samples

    def chunk(self, row: int) -> np.ndarray:
        """Chunk `row` of the folder: its seq_len token ids."""
        import numpy as np

        from zebra.data.indexed import open_dataset

        if self._shards is None:
            self._shards = [open_dataset(prefix) for prefix in self.folder.prefixes]
        shard = int(np.searchsorted(self._starts, row, side="right")) - 1
        return self._shards[shard][row - int(self._starts[shard])]

    def __getitem__(self, sample: int) -> dict[str, torch.Tensor]:
        import torch

        ids = torch.from_numpy(self.chunk(int(self.order.rows([sample])[0])).astype("int64"))  # [T]
        labels = torch.zeros_like(ids)
        labels[:-1] = ids[1:]  # next token inside the chunk
        loss_mask = torch.ones(ids.shape, dtype=torch.float32)
        loss_mask[-1] = 0.0  # the chunk's last token has no target
        return {"tokens": ids, "labels": labels, "loss_mask": loss_mask}

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers reopen the memory maps
        return {**self.__dict__, "_shards": None}
