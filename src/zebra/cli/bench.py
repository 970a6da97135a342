"""`zebra bench`: measure zebra itself (startup today; data, train and decode throughput join here)."""

from __future__ import annotations

from typing import Annotated

import typer

from zebra.bench.data import bench_data
from zebra.bench.startup import measure_startup
from zebra.cli._options import (
    CompileOpt,
    CudaGraphOpt,
    DeviceOpt,
    JsonOpt,
    SetOpt,
    examples,
    tokenizer_option,
)
from zebra.cli._output import out
from zebra.errors import ZebraError

app = typer.Typer(help="Measure startup, data, training and decoding speed.", no_args_is_help=True)


@app.command(epilog=examples("zebra bench startup", "zebra bench startup --repeats 20 --json"))
def startup(
    repeats: Annotated[int, typer.Option("--repeats", "-n", min=1, help="Fresh processes per command.")] = 10,
    json_: JsonOpt = False,
) -> None:
    """Wall time of `zebra --help`, `--version` and `recipes list` in fresh processes, and heavy imports."""
    with out.progress("startup", unit="run") as bar:
        results = measure_startup(repeats=repeats, on_progress=bar)
    if json_:
        out.json([r.to_dict() for r in results])
        return
    rows = []
    for r in results:
        heavy = "n/a" if r.heavy is None else (", ".join(r.heavy) or "none")
        rows.append(
            [r.command, f"{r.median * 1000:.0f} ms", f"{r.best * 1000:.0f} ms", len(r.seconds), heavy]
        )
    out.table(
        ["command", "median", "min", "runs", "heavy imports"],
        rows,
        title="zebra startup (fresh processes)",
        justify={"median": "right", "min": "right", "runs": "right"},
    )
    for r in results:
        if r.heavy:
            out.warn(
                f"`{r.command}` imports {', '.join(r.heavy)}: import them inside the command that needs them"
            )


@app.command(
    epilog=examples(
        "zebra bench decode 1b-gdn-pure --batch 1,8 --prompt 2048 --new 256",
        "zebra bench decode runs/my-run --batch 1 --dtype bf16 --json",
        "zebra bench decode tiny --device cpu --dtype fp32 --batch 1,2 --prompt 64 --new 16",
    )
)
def decode(
    model: Annotated[str, typer.Argument(help="Export / FLA / run directory, or a recipe (random weights).")],
    batch: Annotated[str, typer.Option("--batch", "-b", help="Comma-separated batch sizes.")] = "1,8",
    prompt: Annotated[int, typer.Option("--prompt", min=1, help="Prompt tokens per sequence.")] = 2048,
    new: Annotated[int, typer.Option("--new", min=2, help="New tokens per sequence.")] = 256,
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16, fp32 or auto.")] = "bf16",
    device: DeviceOpt = None,
    no_hf: Annotated[bool, typer.Option("--no-hf", help="Skip HF generate.")] = False,
    cache: Annotated[
        str, typer.Option("--cache", help="auto (static on GPU for zebra models), static or dynamic.")
    ] = "auto",
    cuda_graph: CudaGraphOpt = True,
    compile_: CompileOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Prefill and decode speed of the generation engine next to HF generate, and the memory roofline."""
    from zebra.bench.decode import DecodeBenchConfig, run_decode_bench

    try:
        batches = [int(b) for b in batch.split(",") if b.strip()]
    except ValueError:
        raise ZebraError(f"--batch {batch}: not a list of integers", fix="e.g. --batch 1,8") from None
    cfg = DecodeBenchConfig(
        model=model,
        batches=batches,
        prompt=prompt,
        new=new,
        dtype=dtype,
        device=device,
        hf=not no_hf,
        cache=cache,
        cuda_graph=cuda_graph,
        compile=compile_,
    )
    with out.progress("decode bench", unit="phase") as bar:
        report = run_decode_bench(cfg, on_progress=bar)
    if json_:
        out.json(report.to_dict())
        return
    _decode_table(report)


def _decode_table(report) -> None:
    def mib(n: int | None) -> str:
        return "" if n is None else f"{n / 2**20:,.2f}"

    rows = []
    for r in report.rows:
        rows.append(
            [
                r.batch,
                f"{r.prefill_tokens_per_s:,.0f}",
                f"{r.decode_ms_per_token:.3f}",
                f"{r.decode_tokens_per_s:,.1f}",
                "" if r.hf_decode_ms_per_token is None else f"{r.hf_decode_ms_per_token:.3f}",
                "" if r.speedup_vs_hf is None else f"{r.speedup_vs_hf:.1f}x",
                f"{r.roofline_ms:.3f}",
                f"{r.roofline_ratio:.2f}x",
                mib(r.cache_bytes),
                mib(r.cache_bytes_arch),
                mib(r.peak_memory_bytes),
            ]
        )
    cols = [
        "batch",
        "prefill tok/s",
        "decode ms/tok",
        "decode tok/s",
        "HF ms/tok",
        "vs HF",
        "roofline ms",
        "x roofline",
        "cache MiB",
        "arch MiB",
        "peak MiB",
    ]
    out.table(
        cols,
        rows,
        title=f"decode: {report.model} on {report.device}, {report.dtype}, prompt {report.prompt} + {report.new} new, "
        f"{report.cache} cache{', CUDA graph' if report.cuda_graph else ''}{', compiled' if report.compile else ''}",
        justify={c: "right" for c in cols},
    )
    out.text(
        f"roofline = (weights {report.weight_bytes_per_step / 1e9:.3f} GB + cache bytes per step) / "
        f"{report.bandwidth_gb_s:,.0f} GB/s (device copy measured now); params {report.params:,}; torch {report.torch_version}"
    )


@app.command(
    "data",
    epilog=examples(
        "zebra bench data",
        "zebra bench data --train-bpe 8192",
        "zebra bench data --corpus my.jsonl --tokenizer meta-llama/Llama-3.2-1B --json",
    ),
)
def data_(
    corpus: Annotated[
        str | None,
        typer.Option("--corpus", help="jsonl file with a 'text' field (default: the sample corpus)."),
    ] = None,
    tokenizer: Annotated[str, tokenizer_option("byte", short=True)] = "byte",
    train_bpe: Annotated[
        int | None,
        typer.Option("--train-bpe", help="Train a BPE of this vocabulary on the corpus, in Llama-3's form."),
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", "-w", min=1, help="Processes (default: all cores).")
    ] = None,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Copies of the sample corpus.")] = 8,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="Alternating runs of each; best counts.")
    ] = 3,
    json_: JsonOpt = False,
) -> None:
    """Tokenization throughput of `zebra data prep` against Megatron's per-document preprocess loop."""
    with out.stderr.status("starting") as status:
        r = bench_data(
            corpus,
            tokenizer=tokenizer,
            train_bpe=train_bpe,
            workers=workers,
            repeat=repeat,
            rounds=rounds,
            on_phase=lambda msg: status.update(msg),
        )
    if json_:
        out.json(r.to_dict())
        return
    cols = ["pipeline", "seconds", "tokens/s", "CPU seconds", "tokens per CPU-second"]
    out.table(
        cols,
        [
            [
                "Megatron-style (per-document encode)",
                f"{r.baseline_seconds:.2f}",
                f"{r.baseline_tokens_per_s:,.0f}",
                f"{r.baseline_cpu_seconds:.2f}",
                f"{r.tokens / r.baseline_cpu_seconds:,.0f}",
            ],
            [
                "zebra data prep",
                f"{r.ours_seconds:.2f}",
                f"{r.ours_tokens_per_s:,.0f}",
                f"{r.ours_cpu_seconds:.2f}",
                f"{r.tokens / r.ours_cpu_seconds:,.0f}",
            ],
        ],
        title=f"{r.corpus}: {r.documents:,} documents, {r.tokens:,} tokens, {r.tokenizer}, {r.workers} workers, "
        f"best of {r.rounds}",
        justify={c: "right" for c in cols[1:]},
    )
    out.text(
        f"speedup {r.speedup:.2f}x wall, {r.per_core_speedup:.2f}x per core (tokens per CPU-second); "
        f"outputs {'identical' if r.identical_output else 'DIFFERENT'}"
    )
    out.text(
        "zebra data prep encoded with " + ", ".join(f"{k} ({v:,} documents)" for k, v in r.encoders.items())
    )
    if not r.identical_output:
        raise ZebraError(
            "the two pipelines wrote different tokens", fix="report this as a bug in zebra data prep"
        )


@app.command(
    "train",
    epilog=examples(
        "zebra bench train 1b-gdn-pure --batch 8 --against fla",
        "zebra bench train 1b-kda-pure --steps 30 --json",
        "zebra bench train tiny --steps 5 --batch 4 --seq-len 128",
    ),
)
def train_(
    recipe: Annotated[str, typer.Argument(help="Recipe name or YAML path.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed optimizer steps.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed steps first.")] = 3,
    batch: Annotated[
        int | None,
        typer.Option("--batch", "-b", min=1, help="Sequences per step (default: the micro batch)."),
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", min=8, help="Tokens per sequence (default: the recipe's).")
    ] = None,
    against: Annotated[
        str | None, typer.Option("--against", help="Also run FLA's own model at the same shapes: fla.")
    ] = None,
    set_: SetOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Training tokens/s, MFU and peak memory of a recipe with the trainer's step (and FLA's model with --against fla)."""
    from zebra.bench.train import TrainBenchConfig, run_train_bench

    cfg = TrainBenchConfig(
        recipe=recipe,
        steps=steps,
        warmup=warmup,
        batch=batch,
        seq_len=seq_len,
        against=against,
        overrides=set_ or [],
    )
    with out.progress("train bench", unit="model") as bar:
        report = run_train_bench(cfg, on_progress=bar)
    if json_:
        out.json(report.to_dict())
        return
    cols = ["model", "params", "tokens/s", "ms/step", "TFLOP/s", "MFU", "peak GB"]
    rows = [
        [
            r.model,
            f"{r.params / 1e6:,.1f}M",
            f"{r.tokens_per_s:,.0f}",
            f"{r.step_ms:,.1f}",
            f"{r.tflops:.3g}",
            "-" if r.mfu is None else f"{100 * r.mfu:.1f}%",
            "-" if r.peak_memory_gb is None else f"{r.peak_memory_gb:.1f}",
        ]
        for r in report.rows
    ]
    out.table(
        cols,
        rows,
        title=f"train step: {report.recipe} on {report.device}, {report.precision}, batch {report.batch} x "
        f"{report.seq_len}, {report.steps} timed steps after {report.warmup}",
        justify={c: "right" for c in cols[1:]},
    )
    if report.ratio is not None:
        out.text(f"zebra / fla tokens/s: {report.ratio:.2f}x")
    peak = (
        f"{report.peak_flops / 1e12:,.0f} TFLOP/s peak"
        if report.peak_flops
        else "no known peak for this device"
    )
    out.text(
        f"MFU = {report.flops_per_token / 1e9:.4g} GFLOP/token (6N + causal MLA attention) x tokens/s / {peak}; "
        f"torch {report.torch_version}"
    )
