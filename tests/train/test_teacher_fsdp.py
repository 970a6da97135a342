"""The distillation teacher under FSDP2 (two gloo ranks): each rank reads the teacher one tensor at a time and keeps
only its shard, and the sharded teacher's logits are the replicated teacher's."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.multiprocessing as mp
from tests.upcycle.teachers import tiny_llama

WORLD = 2


def _count_live_reads(teacher_module) -> dict:
    """Wrap `zebra.upcycle.open_teacher` so that every tensor its reader hands out is counted while it is alive;
    returns the counter ({"live", "peak", "reads"})."""
    counter = {"live": 0, "peak": 0, "reads": 0}
    opened_by = teacher_module.open_teacher

    class Counted:
        def __init__(self, tensors):
            self.tensors = tensors

        def shapes(self):
            return self.tensors.shapes()

        def get(self, name):
            tensor = self.tensors.get(name)
            counter["live"] += 1
            counter["reads"] += 1
            counter["peak"] = max(counter["peak"], counter["live"])
            weakref.finalize(tensor, lambda: counter.__setitem__("live", counter["live"] - 1))
            return tensor

        def close(self):
            self.tensors.close()

    def open_counted(*args, **kwargs):
        teacher = opened_by(*args, **kwargs)
        teacher.tensors = Counted(teacher.tensors)
        return teacher

    teacher_module.open_teacher = open_counted
    return counter


def _rank(rank: int, init_file: str, teacher: str, out: str) -> None:
    import torch.distributed as dist

    import zebra.upcycle
    from zebra.train.dist import DistEnv
    from zebra.train.distill_teacher import load_teacher

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        counter = _count_live_reads(zebra.upcycle)
        model = load_teacher(teacher, DistEnv(rank, rank, WORLD, torch.device("cpu")), mode="fsdp")
        ids = torch.arange(2 * 7).reshape(2, 7) * 11 % model.config.vocab_size  # [B, T]
        with torch.no_grad():
            logits = model(input_ids=ids).logits  # [B, T, V]
        local = sum(p.to_local().numel() for p in model.parameters())
        full = sum(p.numel() for p in model.parameters())
        torch.save({"logits": logits, "local": local, "full": full, **counter}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("teacher") / "llama", seed=7)


def test_each_rank_reads_one_tensor_at_a_time_and_keeps_its_shard(tmp_path, teacher):
    from zebra.train.dist import DistEnv
    from zebra.train.distill_teacher import load_teacher

    out = tmp_path / "rank"
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(teacher), str(out)), nprocs=WORLD, join=True)
    ranks = [torch.load(f"{out}.{r}") for r in range(WORLD)]

    replicated = load_teacher(str(teacher), DistEnv(0, 0, 1, torch.device("cpu")), mode="none")
    ids = torch.arange(2 * 7).reshape(2, 7) * 11 % replicated.config.vocab_size
    with torch.no_grad():
        want = replicated(input_ids=ids).logits
    for r in ranks:
        torch.testing.assert_close(r["logits"], want, rtol=1e-5, atol=1e-5)
        assert (
            r["reads"] >= 2 * replicated.config.num_hidden_layers
        )  # every tensor was read through the reader
        assert r["peak"] == 1  # ... and let go before the next one
        assert (
            r["local"] <= r["full"] // WORLD + replicated.config.vocab_size
        )  # its shard only (rows rounded up)
    assert sum(r["local"] for r in ranks) == ranks[0]["full"]
