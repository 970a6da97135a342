"""Where a training step's GPU time goes: the top CUDA kernels of one step of a recipe, zebra's model and FLA's (pure
GDN/KDA recipes) or Llama-3.2-1B's, through the step and loss paths that `zebra bench train` times
(`training_step`; `--set train.X=...` switches the recipe's levers on, for the zebra model only).

    python3 scripts/profile-train.py 1b-gdn-pure --batch 8 --against fla --top 25 > profile.txt
    python3 scripts/profile-train.py 1b-mamba-mla --against llama --set train.fuse_projections=true

Each model's table is followed by where its GPU sat idle during the step (`zebra.bench.gpu_idle`: gaps of 20 us or
more, summed by the CPU op that launched the kernel after each gap, then the longest ones); `--trace DIR` also
keeps each step's Chrome trace there (trace_<model>.json.gz, for chrome://tracing or Perfetto). The profiler's
own CPU cost widens the gaps somewhat.
"""

from __future__ import annotations

import argparse
import gc


def profile(name, model, recipe, cfg, device, top: int, trace_dir: str | None, **step_kwargs) -> None:
    import gzip
    import json
    import tempfile
    import time
    from pathlib import Path

    import torch
    from torch.profiler import ProfilerActivity

    from zebra.bench.gpu_idle import idle_gaps
    from zebra.bench.train import training_step

    step, micro = training_step(model, recipe, cfg, device, **step_kwargs)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    for _ in range(3):
        step([micro])
    sync()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        step([micro])
        sync()
        wall_ms = 1000 * (time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        trace = json.loads(Path(f"{tmp}/trace.json").read_text())
    if trace_dir:
        with gzip.open(Path(trace_dir) / f"trace_{name}.json.gz", "wt") as f:
            json.dump(trace, f)
    idle = idle_gaps(trace, min_gap_us=20)
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    print(f"\n== {name}: one step, batch {cfg.batch} x {cfg.seq_len}, CUDA time {total / 1e3:.1f} ms")
    print(f"{'kernel':<90} {'calls':>6} {'ms':>8} {'%':>6}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        ms = e.self_device_time_total / 1e3
        print(f"{e.key[:90]:<90} {e.count:>6} {ms:>8.2f} {100 * ms * 1e3 / total:>6.1f}")
    print(
        f"-- {name}: step wall {wall_ms:.1f} ms (profiled); GPU busy {idle.busy_us / 1e3:.1f} ms, idle "
        f"{idle.idle_us / 1e3:.1f} ms in {len(idle.gaps)} gaps >= 20 us (+ {idle.small_gaps_us / 1e3:.1f} ms in "
        "shorter ones) between its first and last kernel"
    )
    print(f"{'op that launched the kernel after the gap':<90} {'gaps':>6} {'ms':>8}")
    for op, n, us in idle.by_launcher()[:top]:
        print(f"{op[:90]:<90} {n:>6} {us / 1e3:>8.2f}")
    print(f"{'longest gaps: kernel after it (launched by)':<90} {'':>6} {'us':>8}")
    for gap in sorted(idle.gaps, key=lambda g: -g.us)[:10]:
        print(f"{(gap.next_kernel[:50] + ' (' + gap.launched_by + ')')[:90]:<90} {'':>6} {gap.us:>8.0f}")


def main() -> None:
    import torch

    from zebra.bench.train import TrainBenchConfig, fla_model, labels_loss_sum, llama_model
    from zebra.recipes import load_recipe
    from zebra.train.trainer import build_model

    p = argparse.ArgumentParser()
    p.add_argument("recipe")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--against", choices=["fla", "llama"])
    p.add_argument("--top", type=int, default=25)
    p.add_argument(
        "--trace", metavar="DIR", help="keep each step's Chrome trace in DIR (trace_<model>.json.gz)"
    )
    p.add_argument("--set", action="append", default=[], dest="overrides", help="recipe override KEY=VALUE")
    a = p.parse_args()
    recipe = load_recipe(a.recipe, overrides=a.overrides)
    cfg = TrainBenchConfig(recipe=a.recipe, batch=a.batch, seq_len=recipe.data.seq_len)
    # on a CPU there are no kernels to list: a dry run of the script before it spends GPU time
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    profile("zebra", build_model(recipe, device), recipe, cfg, device, a.top, a.trace)
    if a.against:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        other = fla_model(recipe, device) if a.against == "fla" else llama_model(device, recipe.train.seed)
        profile(
            a.against,
            other,
            recipe,
            cfg,
            device,
            a.top,
            a.trace,
            loss_fn=labels_loss_sum,
            score_last=False,
            levers=False,
        )


if __name__ == "__main__":
    main()
