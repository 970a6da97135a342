"""Where a training step's GPU time goes: the top CUDA kernels of one step of a recipe, zebra's model and (for pure
GDN/KDA recipes) FLA's, through the same `TrainStep` and loss paths that `zebra bench train` times.

    python3 scripts/profile-train.py 1b-gdn-pure --batch 8 --against fla --top 25 > profile.txt
"""

from __future__ import annotations

import argparse
import gc


def profile(name, model, recipe, batch: int, seq_len: int, top: int, loss_fn=None) -> None:
    import torch
    from torch.profiler import ProfilerActivity

    from zebra.train.dist import DistEnv
    from zebra.train.optim import build_optimizer
    from zebra.train.parallelize import parallelize
    from zebra.train.step import TrainStep

    device = torch.device("cuda")
    t = recipe.train
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=device)
    model = parallelize(model, env, mode="none", bf16=True, activation_checkpointing=False, compile=False)
    step = TrainStep(
        model,
        build_optimizer(model, t, device),
        None,
        env,
        autocast_bf16=True,
        clip_grad=1.0,
        loss_fn=loss_fn,
    )
    text = torch.randint(0, recipe.model.vocab_size, (batch, seq_len + 1))
    micro = {"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": torch.ones(batch, seq_len)}
    for _ in range(3):
        step([micro])
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        step([micro])
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    print(f"\n== {name}: one step, batch {batch} x {seq_len}, CUDA time {total / 1e3:.1f} ms")
    print(f"{'kernel':<90} {'calls':>6} {'ms':>8} {'%':>6}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        ms = e.self_device_time_total / 1e3
        print(f"{e.key[:90]:<90} {e.count:>6} {ms:>8.2f} {100 * ms * 1e3 / total:>6.1f}")


def main() -> None:
    import torch

    from zebra.bench.train import fla_loss_sum, fla_model
    from zebra.recipes import load_recipe
    from zebra.train.trainer import build_model

    p = argparse.ArgumentParser()
    p.add_argument("recipe")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--against", choices=["fla"])
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    recipe = load_recipe(a.recipe)
    device = torch.device("cuda")
    profile("zebra", build_model(recipe, device), recipe, a.batch, recipe.data.seq_len, a.top)
    if a.against:
        gc.collect()
        torch.cuda.empty_cache()
        profile("fla", fla_model(recipe, device), recipe, a.batch, recipe.data.seq_len, a.top, fla_loss_sum)


if __name__ == "__main__":
    main()
