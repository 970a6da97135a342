"""Decode speed of whichever zebra comes first on PYTHONPATH, for a before/after comparison in one GPU session.

Only the engine API that every version has is used (Engine, new_state, prefill, step, generate), on a recipe with
random weights (bf16, static cache, CUDA graph), prompt P, N new tokens, per batch size:
- kernels: CUDA kernels one decode step launches, counted by the profiler on an eager step (no graph), and the
  TOP_KERNELS of them by device time (top_kernels: name, launches, microseconds);
- step_ms: N `Engine.step` calls, each fed the argmax of the last logits on the device, one sync at the end;
- generate_ms: the `Engine.generate` loop (greedy, no stop ids), first to last column / (N - 1).
With --compile the step is `torch.compile`d inside the CUDA graph (kernels are still counted on the eager step).
One JSON line per batch size, tagged with --label.

    PYTHONPATH=/tmp/site:.base/src:.base/kernels python3 scripts/decode-ab.py 1b-gdn-pure --label before
    PYTHONPATH=/tmp/site:src:kernels python3 scripts/decode-ab.py 1b-gdn-pure --label after
"""

from __future__ import annotations

import argparse
import json
import time

TOP_KERNELS = 15  # the kernels of one eager step listed by device time (where a decode step's time goes)


def kernels_per_step(model, prompt) -> tuple[int, list[list]]:
    import torch
    from torch.profiler import ProfilerActivity

    from zebra.generation import Engine

    engine = Engine(model, cache="static", cuda_graph=False, max_seq_len=prompt.shape[1] + 4)
    state = engine.new_state(prompt.shape[0], capacity=prompt.shape[1] + 4)
    engine.prefill(state, prompt)
    tokens = state.logits.argmax(-1)
    engine.step(state, tokens)  # warm: autotuning and lazily built tensors stay out of the count
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step(state, tokens)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
    top = sorted(kernels, key=lambda e: -e.device_time_total)[:TOP_KERNELS]
    return sum(e.count for e in kernels), [[e.key[:80], e.count, round(e.device_time_total, 1)] for e in top]


def step_and_generate_ms(engine, prompt, new: int) -> tuple[float, float]:
    import torch

    state = engine.new_state(prompt.shape[0], capacity=prompt.shape[1] + new)
    engine.prefill(state, prompt)
    tokens = state.logits.argmax(-1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(new):
        tokens = engine.step(state, tokens).argmax(-1)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) / new * 1e3
    stamps = [time.perf_counter() for _ in engine.generate(prompt.tolist(), max_new_tokens=new)]
    return step_ms, (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--label", required=True)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--compile", action="store_true", help="torch.compile the step inside the CUDA graph")
    args = parser.parse_args()

    import torch

    import zebra
    from zebra.generation import Engine
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = ZebraForCausalLM(load_recipe(args.recipe).model.to_config()).to(torch.bfloat16).eval()
    engine = Engine(model, compile=args.compile, max_seq_len=args.prompt + args.new)
    for batch in (int(b) for b in args.batch.split(",")):
        gen = torch.Generator().manual_seed(batch)
        prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt), generator=gen).cuda()
        with torch.inference_mode():
            kernels, top = kernels_per_step(model, prompt)
            step_and_generate_ms(engine, prompt, 8)  # warm-up: graph captures
            step_ms, generate_ms = step_and_generate_ms(engine, prompt, args.new)
        row = {
            "label": args.label,
            "zebra": zebra.__file__,
            "recipe": args.recipe,
            "batch": batch,
            "compile": engine.compiled,
            "kernels_per_step": kernels,
            "step_ms": round(step_ms, 4),
            "generate_ms": round(generate_ms, 4),
            "generate_over_step": round(generate_ms / step_ms, 3),
            "top_kernels": top,  # [name, launches, device us] of the eager step, most time first
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
