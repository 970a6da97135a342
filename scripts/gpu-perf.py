"""The performance phases of scripts/gpu-session.sh in one process each: Triton's autotuning and FLA's kernels
are compiled once for all the variants of a phase. Every measurement is one line of perf.jsonl; `table` prints
them with the issue-18 goals checked.

    python3 scripts/gpu-perf.py train 1b-gdn-pure base-b8 base-b16 fuse --out OUT/perf.jsonl
    python3 scripts/gpu-perf.py ssd 1b-mamba-mla [256 ...] --out OUT/perf.jsonl     # mamba-ssm's chunk sizes
    python3 scripts/gpu-perf.py kernels 1b-gdn-pure --out OUT/perf.jsonl   # pre-norm and SwiGLU: ours vs FLA's
    python3 scripts/gpu-perf.py table OUT/perf.jsonl

A variant that fails is recorded with its error and the next one runs (the risky ones, compile and fp8, come
last: a CUDA error leaves the process unusable). No variant starts when fewer seconds are left before the
DEADLINE_AT environment variable (a Unix time) than it needs: MIN_LEFT for the first (Triton autotunes), WARM_LEFT
for the next ones; skipped ones are recorded as such.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import traceback
from pathlib import Path

GDN_VS_FLA = 1.25  # 1b-gdn-pure tokens/s over FLA's class, batch 8 and 16
GDN_MFU = 0.62  # of the bf16 matmul peak measured in the run
HYBRID_VS_LLAMA = 1.4
MIN_LEFT = 75  # seconds the first variant of a process needs at least (build, autotune, warm-up, timed steps)
WARM_LEFT = 30  # seconds a later one needs (the kernels are tuned; builds, warm-up and timed steps only)
# 4 warm-up steps: with 2, FP8 on the compiled MLPs timed 69.2k tokens/s where `zebra train` reached 71.8k by its
# 20th step (bf16: 63.0k and 63.4k; H100, 2026-12-05)
STEPS, WARMUP = 10, 4

FP8_MLP = ["train.fp8=true", "train.fp8_sublayers=-", "train.compile=true", "train.compile_sublayers=-"]

# name -> (batch, against, recipe overrides); the levers of docs/benchmarks.md, "Training levers"
VARIANTS: dict[str, tuple[int, str | None, list[str]]] = {
    "base-b8": (8, "fla", []),
    "base-b16": (16, "fla", []),
    "vs-llama": (8, "llama", []),
    # 1b-kda-mla trains at 8 x 8192, where Llama's float32 logits do not fit on an H200: both at 8 x 2048
    "vs-llama-2k": (8, "llama", ["data.seq_len=2048"]),
    "fuse": (8, None, ["train.fuse_projections=true"]),
    "optgraph": (8, None, ["train.optimizer_graph=true"]),
    "fuse-vs-llama": (8, "llama", ["train.fuse_projections=true"]),
    "ac-b16": (16, None, ["train.activation_checkpointing=true"]),
    "mamba-ssm": (8, None, ["model.kernel_backend=mamba_ssm"]),
    # the Mamba2 scan on FLA's kernels (auto runs mamba-ssm's where it imports)
    "ssd-fla": (8, None, ["model.kernel_backend=fla"]),
    "compile-mlp": (8, None, ["train.compile=true", "train.compile_sublayers=-"]),
    "compile-all": (8, None, ["train.compile=true"]),
    "fp8": (
        8,
        "fla",
        ["train.fp8=true", "train.fp8_sublayers=all", "train.compile=true", "train.compile_sublayers=-"],
    ),
    # every sublayer compiled: torchao's float8 casts fuse only inside compiled code (the fp8 row above left the
    # GDN projections eager and ran 40% slower than bf16 on 2026-12-04)
    "fp8-all": (8, "fla", ["train.fp8=true", "train.fp8_sublayers=all", "train.compile=true"]),
    # float8 only where the GEMMs are widest (the MLPs: 2048 x 8192), those compiled; the recurrent mixers' narrower
    # projections stay bf16 and eager. Each row times the goal's reference in the same run (FLA's class, Llama's
    # shape for the hybrids)
    "fp8-mlp": (8, "fla", FP8_MLP),
    "fp8-mlp-b16": (16, "fla", FP8_MLP),
    "fp8-mlp-vs-llama": (8, "llama", FP8_MLP),
    "fp8-mlp-vs-llama-2k": (8, "llama", ["data.seq_len=2048", *FP8_MLP]),
    # the rows above take train.fp8_recipe's default, tensorwise scales (rowwise before 2026-12-05 15:50 UTC; that
    # day's tensorwise rows ran as fp8-mlp-tw*); rowwise, a scale per row, for comparison
    "fp8-mlp-rowwise": (8, "fla", [*FP8_MLP, "train.fp8_recipe=rowwise"]),
    "fp8-mlp-rowwise-b16": (16, "fla", [*FP8_MLP, "train.fp8_recipe=rowwise"]),
    "fp8-all-b16": (16, "fla", ["train.fp8=true", "train.fp8_sublayers=all", "train.compile=true"]),
    # float8 MLPs with the GDN/MLA input projections as one bf16 GEMM (fuse alone: +1.4% at batch 8, 2026-12-03)
    "fp8-mlp-fuse": (8, "fla", [*FP8_MLP, "train.fuse_projections=true"]),
    "fp8-mlp-fuse-b16": (16, "fla", [*FP8_MLP, "train.fuse_projections=true"]),
}


def seconds_left() -> float:
    return float(os.environ.get("DEADLINE_AT", time.time() + 1e6)) - time.time()


def write_line(out: Path, variant: str, **fields) -> None:
    with out.open("a") as f:
        f.write(json.dumps({"variant": variant, **fields}) + "\n")
    print(f"{variant}: {'error ' + fields['error'] if 'error' in fields else 'done'}", flush=True)


def run_train(recipe: str, variants: list[str], out: Path) -> None:
    """Each variant through `zebra.bench.train.run_train_bench`, in this process."""
    import torch

    from zebra.bench.train import TrainBenchConfig, run_train_bench

    for i, name in enumerate(variants):
        if name not in VARIANTS:
            write_line(out, name, error=f"unknown variant (known: {', '.join(VARIANTS)})")
            continue
        if seconds_left() < (MIN_LEFT if i == 0 else WARM_LEFT):
            write_line(out, name, error="skipped: DEADLINE")
            continue
        batch, against, overrides = VARIANTS[name]
        cfg = TrainBenchConfig(recipe=recipe, steps=STEPS, warmup=WARMUP, batch=batch, against=against,
                               overrides=overrides)  # fmt: skip
        start = time.time()
        try:
            report = run_train_bench(cfg)
            write_line(out, name, wall_s=round(time.time() - start), **report.to_dict())
        except Exception as error:  # the next variant still runs
            traceback.print_exc()
            write_line(out, name, error=f"{type(error).__name__}: {error}"[:400])
        gc.collect()
        torch.cuda.empty_cache()


def run_ssd(recipe: str, chunk_sizes: list[int], out: Path) -> None:
    from zebra.bench.ssd import MAMBA_SSM_CHUNKS, run_ssd_bench

    try:
        report = run_ssd_bench(recipe, chunk_sizes=chunk_sizes or MAMBA_SSM_CHUNKS)
        write_line(out, "ssd", **report.to_dict())
    except Exception as error:
        traceback.print_exc()
        write_line(out, "ssd", error=f"{type(error).__name__}: {error}"[:400])


def _fwd_bwd_ms(fn, inputs, grads, repeats: int) -> tuple[float, list]:
    """Median ms of `fn(*inputs)` forward + backward (outputs' gradients `grads`; `zebra.bench.ssd.median_ms`)
    and the inputs' gradients."""
    import torch

    from zebra.bench.ssd import median_ms

    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    def step():
        for leaf in leaves:
            leaf.grad = None
        outputs = fn(*leaves)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        torch.autograd.backward(outputs, [g.to(o.dtype) for o, g in zip(outputs, grads, strict=True)])

    return median_ms(step, warmup=3, repeats=repeats), [leaf.grad.float() for leaf in leaves]


def run_kernels(recipe: str, out: Path, repeats: int = 20) -> None:
    """Our training kernels against FLA's at the recipe's micro-batch, forward + backward, in one process: the
    sublayer pre-norm (bf16 mixer output + float32 stream) and the MLP's SwiGLU + down projection (bf16
    activations, float32 weight under bf16 autocast). One line each: both times and the largest relative
    difference of the gradients."""
    import torch
    from fla.modules.activations import swiglu_linear as fla_swiglu_linear
    from fla.modules.norm.layernorm import rms_norm as fla_rms_norm

    import zebra_kernels as zk
    from zebra.recipes import load_recipe

    r = load_recipe(recipe)
    T, D, Fd = r.train.micro_batch_size * r.data.seq_len, r.model.hidden_size, r.model.intermediate_size
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    def autocast(fn):
        def run(*args):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return fn(*args)

        return run

    cases = {
        "pre-norm": (
            {
                "zebra": lambda x, s, w: zk.rms_norm(x, w, eps=1e-6, residual=s, prenorm=True),
                "fla": lambda x, s, w: fla_rms_norm(x, w, None, residual=s, eps=1e-6, prenorm=True),
            },
            [randn(T, D, dtype=torch.bfloat16), randn(T, D), randn(D).abs() + 0.5],
            [randn(T, D), randn(T, D)],
        ),
        "swiglu+down": (
            {
                "zebra": autocast(lambda g, u, w: zk.swiglu_linear(g, u, w)),
                "fla": autocast(lambda g, u, w: fla_swiglu_linear(g, u, w, None)),
            },
            [randn(T, Fd, dtype=torch.bfloat16), randn(T, Fd, dtype=torch.bfloat16), randn(D, Fd) / Fd**0.5],
            [randn(T, D)],
        ),
    }
    for case, (impls, inputs, grads) in cases.items():
        try:
            (ours, ours_grads), (theirs, their_grads) = (
                _fwd_bwd_ms(fn, inputs, grads, repeats) for fn in impls.values()
            )
            diff = max(
                float((a - b).abs().max() / b.abs().max())
                for a, b in zip(ours_grads, their_grads, strict=True)
            )
            write_line(out, "kernels", case=case, recipe=recipe, zebra_ms=ours, fla_ms=theirs,
                       max_rel_grad_diff=diff)  # fmt: skip
        except Exception as error:
            traceback.print_exc()
            write_line(out, "kernels", case=case, error=f"{type(error).__name__}: {error}"[:400])


def goal(record: dict) -> str:
    """The issue-18 goal this row answers, met or missed; empty when none applies."""
    ratio, rows = record.get("ratio"), record.get("rows", [])
    if ratio is None or not rows:
        return ""
    against = rows[1]["model"].split()[0]
    if record["recipe"] == "1b-gdn-pure" and against == "fla":  # with or without levers (the levers column)
        mfu = rows[0].get("mfu_measured")
        ok = ratio >= GDN_VS_FLA and mfu is not None and mfu >= GDN_MFU
        return f"{'met' if ok else 'MISSED'} (>= {GDN_VS_FLA}x fla, >= {GDN_MFU:.0%} measured peak)"
    if against == "llama":
        return f"{'met' if ratio >= HYBRID_VS_LLAMA else 'MISSED'} (>= {HYBRID_VS_LLAMA}x llama)"
    return ""


def _levers_on(record: dict) -> list[str]:
    levers = record.get("levers", {})
    on = [
        k
        for k in (
            "compile",
            "fuse_projections",
            "optimizer_graph",
            "fp8",
            "activation_checkpointing",
        )
        if levers.get(k)
    ]
    for lever in ("compile", "fp8"):
        if levers.get(lever) and levers.get(f"{lever}_sublayers", "all") != "all":
            on[on.index(lever)] = f"{lever}[{levers[f'{lever}_sublayers']}]"
    if levers.get("fp8"):
        on.append(levers.get("fp8_recipe", "rowwise"))  # reports from before the key: rowwise
    if levers.get("kernel_backend") not in (None, "auto"):
        on.append(f"backend={levers['kernel_backend']}")
    return on


def train_line(record: dict) -> str:
    rows = record["rows"]
    z = rows[0]
    other = rows[1] if len(rows) > 1 else None
    cells = [
        record["variant"],
        record["recipe"],
        str(record["batch"]),
        ", ".join(_levers_on(record)) or "-",
        f"{z['tokens_per_s']:,.0f}",
        "-" if z.get("mfu_measured") is None else f"{z['mfu_measured']:.1%}",
        "-" if z.get("peak_memory_gb") is None else f"{z['peak_memory_gb']:.1f} / {z['resident_gb']:.1f}",
        record.get("against_error")
        or ("-" if other is None else f"{other['model'].split()[0]} {other['tokens_per_s']:,.0f}"),
        "-" if record.get("ratio") is None else f"{record['ratio']:.2f}x",
        goal(record),
    ]
    return "| " + " | ".join(cells) + " |"


def ssd_lines(record: dict) -> list[str]:
    out = [f"Mamba2 scan ({record['recipe']} shapes, B={record['batch']} T={record['seq_len']}, "
           f"x{record['mamba_sublayers']} sublayers per step), auto runs {record['auto']} "
           f"(mamba-ssm chunk {record['auto_chunk']}):"]  # fmt: skip
    for r in record["rows"]:
        name = r["backend"] + (f" chunk {r['chunk_size']}" if r["chunk_size"] else "")
        if r["error"]:
            out.append(f"  {name}: failed: {r['error']}")
        else:
            out.append(f"  {name}: forward {r['forward_ms']:.3f} ms, forward+backward {r['forward_backward_ms']:.3f} ms,"
                       f" rel err vs fla {r['rel_err_vs_fla']:.1e}")  # fmt: skip
    out.append(
        f"  to make auto take the fastest: {record['advice']}"
        if record["advice"]
        else "  auto is the fastest"
    )
    return out


def table(path: Path) -> str:
    head = ("| variant | recipe | batch | levers | zebra tok/s | MFU (measured peak) | peak / resident GB | "
            "against tok/s | ratio | goal |\n|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    train, other = [head], []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "rows" in record and "recipe" in record and "steps" in record:
            train.append(train_line(record))
        elif record["variant"] == "kernels" and "zebra_ms" in record:
            other.append(f"{record['case']} forward+backward at {record['recipe']}'s micro-batch: zebra "
                         f"{record['zebra_ms']:.3f} ms, fla {record['fla_ms']:.3f} ms "
                         f"({record['fla_ms'] / record['zebra_ms']:.2f}x), gradients differ by "
                         f"{record['max_rel_grad_diff']:.1e} of their largest")  # fmt: skip
        elif "rows" in record:
            other += ssd_lines(record)
        else:
            other.append(f"{record['variant']}: {record.get('error', '')}")
    return "\n".join([*train, "", *other])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["train", "ssd", "kernels", "table"])
    p.add_argument("target", help="recipe (train, ssd) or perf.jsonl (table)")
    p.add_argument(
        "variants", nargs="*", help=f"train: any of {', '.join(VARIANTS)}; ssd: mamba-ssm chunk sizes"
    )
    p.add_argument("--out", type=Path, help="perf.jsonl to append to")
    a = p.parse_args()
    if a.what == "table":
        print(table(Path(a.target)))
    elif a.what == "ssd":
        run_ssd(a.target, [int(c) for c in a.variants], a.out)
    elif a.what == "kernels":
        run_kernels(a.target, a.out)
    else:
        run_train(a.target, a.variants, a.out)


if __name__ == "__main__":
    main()
