"""`zebra bench`: measure zebra itself: startup, data, training and decoding speed, and training parity with FLA."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
from zebra.core.errors import ZebraError

app = typer.Typer(
    help="Measure startup, data, training and decoding speed, and training parity with FLA.",
    no_args_is_help=True,
)


@app.command(epilog=examples("zebra bench startup", "zebra bench startup --repeats 20 --json"))
def startup(
    repeats: Annotated[int, typer.Option("--repeats", "-n", min=1, help="Fresh processes per command.")] = 10,
    json_: JsonOpt = False,
) -> None:
    """Wall time of `zebra --help`, `--version` and `recipes list` in fresh processes, and heavy imports."""
    from zebra.bench.startup import measure_startup

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
    lengths: Annotated[
        str,
        typer.Option(
            "--lengths",
            help="Comma-separated cached tokens: batch-1 step ms in a --capacity cache against one sized to each.",
        ),
    ] = "",
    capacity: Annotated[
        int | None,
        typer.Option("--capacity", min=2, help="The large cache of --lengths (default: longest + --new)."),
    ] = None,
    profile: Annotated[
        bool, typer.Option("--profile", help="Per-kernel breakdown of one step at the first batch size.")
    ] = False,
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            help="llama: also Llama-3.2-1B's shape (transformers + SDPA, HF generate with a static KV cache).",
        ),
    ] = None,
    fused_decode: Annotated[
        bool,
        typer.Option(
            "--fused-decode",
            help="Decode GEMVs on Zebra's kernels, the norms and SwiGLU fused in (zebra_kernels.gemv).",
        ),
    ] = False,
    json_: JsonOpt = False,
) -> None:
    """Prefill and decode speed of the generation engine next to HF generate, and the memory roofline."""
    from zebra.folders.model_folder import model_dir_or_recipe

    model_dir_or_recipe(model)  # a mistyped MODEL told before torch is imported
    from zebra.bench.decode import DecodeBenchConfig, check_decode_config, run_decode_bench

    try:
        batches = [int(b) for b in batch.split(",") if b.strip()]
    except ValueError:
        raise ZebraError(f"--batch {batch}: not a list of integers", fix="e.g. --batch 1,8") from None
    try:
        cached = [int(n) for n in lengths.split(",") if n.strip()]
    except ValueError:
        raise ZebraError(
            f"--lengths {lengths}: not a list of integers", fix="e.g. --lengths 1024,8192"
        ) from None
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
        lengths=cached,
        capacity=capacity,
        profile=profile,
        against=against,
        fused_decode=fused_decode,
    )
    check_decode_config(cfg)  # before the progress bar draws
    with out.progress("decode bench", unit="phase") as bar:
        report = run_decode_bench(cfg, on_progress=bar)
    if json_:
        out.json(report.to_dict())
        return
    _decode_table(report)


def _decode_table(report) -> None:
    def mib(n: int | None) -> str:
        return "" if n is None else f"{n / 2**20:,.2f}"

    def ms(x: float | None) -> str:
        return "" if x is None else f"{x:.3f}"

    def times(x: float | None) -> str:
        return "" if x is None else f"{x:.1f}x"

    def llama_cells(r) -> list[str]:  # --against llama: prefill tokens/s, ms/token, the speed-up, KV cache
        return [f"{r.llama_prefill_tokens_per_s:,.0f}", ms(r.llama_decode_ms_per_token), times(r.speedup_vs_llama),
                mib(r.llama_kv_cache_bytes)]  # fmt: skip

    rows = []
    for r in report.rows:
        rows.append(
            [
                r.batch,
                f"{r.prefill_tokens_per_s:,.0f}",
                ms(r.step_ms_per_token),
                ms(r.decode_ms_per_token),
                f"{r.decode_tokens_per_s:,.1f}",
                f"{r.loop_over_step:.2f}",
                ms(r.hf_decode_ms_per_token),
                times(r.speedup_vs_hf),
                ms(r.fla_decode_ms_per_token),
                times(r.speedup_vs_fla),
                f"{r.roofline_ms:.3f}",
                f"{r.roofline_ratio:.2f}x",
                mib(r.cache_bytes),
                mib(r.cache_bytes_arch),
                mib(r.peak_memory_bytes),
                *(llama_cells(r) if report.llama else []),
            ]
        )
    cols = [
        "batch",
        "prefill tok/s",
        "step ms/tok",
        "decode ms/tok",
        "decode tok/s",
        "loop / step",
        "HF ms/tok",
        "vs HF",
        "FLA ms/tok",
        "vs FLA",
        "roofline ms",
        "step / roofline",
        "cache MiB",
        "arch MiB",
        "peak MiB",
        *(["Llama prefill tok/s", "Llama ms/tok", "vs Llama", "Llama KV MiB"] if report.llama else []),
    ]
    out.table(
        cols,
        rows,
        title=f"decode: {report.model} on {report.device}, {report.dtype}, prompt {report.prompt} + {report.new} new, "
        f"{report.cache} cache{', CUDA graph' if report.cuda_graph else ''}{', compiled' if report.compile else ''}"
        f"{', fused decode GEMVs' if report.fused_decode else ''}",
        justify={c: "right" for c in cols},
    )
    out.text(
        "step = Engine.step fed on the device; decode = the Engine.generate loop (zebra generate, chat); "
        f"FLA: {report.fla}" + (f"; Llama: {report.llama}" if report.llama else "")
    )
    out.text(
        f"roofline = (weights {report.weight_bytes_per_step / 1e9:.3f} GB + cache bytes per step) / "
        f"{report.bandwidth_gb_s:,.0f} GB/s (device copy measured now); params {report.params:,}; torch {report.torch_version}"
    )
    if report.length_rows:
        _length_table(report.length_rows)
    if report.profile is not None:
        _profile_table(report.profile)


def _length_table(rows) -> None:
    cols = ["cached", "capacity", "ms/tok", "sized capacity", "ms/tok (sized)", "ratio"]
    cells = [
        [f"{r.cached:,}", f"{r.capacity:,}", f"{r.capacity_ms_per_token:.3f}", f"{r.sized_capacity:,}",
         f"{r.sized_ms_per_token:.3f}", f"{r.ratio:.3f}"]
        for r in rows
    ]  # fmt: skip
    out.table(
        cols, cells, title="step at each cached length, batch 1: large cache vs one sized to the prompt"
    )


def _profile_table(p) -> None:
    cols = ["kernel", "calls/step", "us/step", "share"]
    cells = [[r.name[:90], f"{r.calls_per_step:g}", f"{r.us_per_step:.1f}", f"{r.share:.1%}"] for r in p.rows]
    roofline = "" if p.roofline_ms is None else f", roofline {p.roofline_ms:.3f} ms"
    out.table(
        cols,
        cells,
        title=f"one decode step, batch {p.batch} ({p.mode}, {p.source}): {p.kernels_per_step:g} per step, "
        f"{p.kernel_us_per_step / 1e3:.3f} ms of kernels, step {p.step_ms:.3f} ms{roofline}",
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
    from zebra.bench.data import bench_data

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
        str | None,
        typer.Option(
            "--against",
            help="Also run fla (FLA's own model at the same shapes; pure GDN/KDA recipes) or llama "
            "(Llama-3.2-1B's shape, transformers + SDPA).",
        ),
    ] = None,
    set_: SetOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Training tokens/s, MFU and peak memory of a recipe with the trainer's step (and FLA's model with --against fla)."""
    from zebra.recipes import load_recipe

    load_recipe(recipe, overrides=set_ or [])  # a mistyped recipe or --set told before torch is imported
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
    for note in report.notes:  # on stderr: `--json` stays parseable
        out.warn(note)
    if json_:
        out.json(report.to_dict())
        return
    _train_table(report)


def _train_table(report) -> None:
    """The human form of a `TrainBenchReport`: one row per model, then the ratio, peaks and levers."""
    cols = [
        "model",
        "params",
        "tokens/s",
        "ms/step",
        "TFLOP/s",
        "MFU",
        "MFU measured",
        "resident GB",
        "peak GB",
        "first step s",
    ]

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    def gb(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    rows = [
        [r.model, f"{r.params / 1e6:,.1f}M", f"{r.tokens_per_s:,.0f}", f"{r.step_ms:,.1f}", f"{r.tflops:.3g}",
         pct(r.mfu), pct(r.mfu_measured), gb(r.resident_gb), gb(r.peak_memory_gb), f"{r.first_step_s:.1f}"]
        for r in report.rows
    ]  # fmt: skip
    out.table(
        cols,
        rows,
        title=f"train step: {report.recipe} on {report.device}, {report.precision}, batch {report.batch} x "
        f"{report.seq_len}, {report.steps} timed steps after {report.warmup}",
        justify={c: "right" for c in cols[1:]},
    )
    if report.ratio is not None:
        out.text(f"zebra / {report.rows[1].model.split()[0]} tokens/s: {report.ratio:.2f}x")
    if report.against_error:
        out.warn(report.against_error)
    datasheet = f"{report.peak_flops / 1e12:,.0f}" if report.peak_flops else "unknown"
    measured = f"{report.measured_peak_flops / 1e12:,.0f}" if report.measured_peak_flops else "not measured"
    zebra = report.rows[0]
    start = zebra.first_step_process_s
    out.text(
        "first step s: from the start of the model's build (compile, kernel compilation, autotuning); "
        + ("" if start is None else f"zebra's first step ended {start:.1f} s after the process started; ")
        + f"of its {zebra.first_step_s:.1f} s: build {zebra.build_s:.1f} s, step set-up {zebra.step_setup_s:.1f} s, "
        f"first step {zebra.first_step_s - zebra.build_s - zebra.step_setup_s:.1f} s; "
        + f"kernel cache: {report.kernel_cache}"
    )
    out.text(
        f"MFU = FLOP/token (6N + causal attention; zebra {report.flops_per_token / 1e9:.4g} G) x tokens/s / peak: "
        f"datasheet {datasheet} TFLOP/s, measured bf16 matmul {measured} TFLOP/s; torch {report.torch_version}"
    )
    out.text("zebra levers: " + ", ".join(f"{k}={v}" for k, v in report.levers.items()))
    out.text(f"zebra kernels: {report.kernels}")


@app.command(
    "parity",
    epilog=examples(
        "zebra bench parity 1b-gdn-pure --data data/fla-docs --steps 200 --set model.vocab_size=16384 "
        "--set data.tokenizer=data/fla-docs/tokenizer",
        "zebra bench parity tiny-gdn --data data/fla-tiny --steps 20 --batch 4 --set train.precision=fp32",
    ),
)
def parity(
    recipe: Annotated[str, typer.Argument(help="A pure GDN or KDA recipe (name or YAML path).")],
    data: Annotated[str, typer.Option("--data", help="A data folder written by `zebra data convert-fla`.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps of each model.")] = 200,
    batch: Annotated[int, typer.Option("--batch", "-b", min=1, help="Sequences (chunks) per step.")] = 8,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder for parity.json, parity.png and both curves.")
    ] = Path("parity"),
    set_: SetOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Train zebra's model and FLA's own class from the same weights on the same FLA-order batches; compare losses."""
    from zebra.bench.parity import ParityConfig, run_parity

    cfg = ParityConfig(
        recipe=recipe, data=data, steps=steps, batch=batch, output=output, overrides=set_ or []
    )
    with out.progress("parity", unit="step", enabled=not json_) as bar:
        report = run_parity(cfg, on_progress=bar)
    if json_:
        out.json(report.to_dict())
        return
    out.table(
        ["step", "zebra loss", "FLA loss", "rel diff"],
        [
            [i + 1, f"{z:.6f}", f"{f:.6f}", f"{abs(z - f) / abs(f):.2e}"]
            for i, (z, f) in enumerate(zip(report.zebra_loss, report.fla_loss, strict=True))
            if i < 3 or i + 1 == report.steps or (i + 1) % max(1, report.steps // 10) == 0
        ],
        title=f"parity: {report.recipe} ({report.params / 1e6:,.1f}M) vs FLA {report.fla_class} on {report.device}, "
        f"{report.precision}, {report.batch} x {report.seq_len} tokens per step",
        justify={"step": "right", "zebra loss": "right", "FLA loss": "right", "rel diff": "right"},
    )
    out.result(
        f"step-1 difference {report.step1_diff:.2e}; largest relative difference {report.max_rel_diff:.2e}; "
        f"final {report.final_rel_diff:.2e}; wrote {output}/parity.json and parity.png"
    )


@app.command(
    "ssd",
    epilog=examples(
        "zebra bench ssd",
        "zebra bench ssd 1b-mamba-mla --batch 16 --json",
    ),
)
def ssd_(
    recipe: Annotated[
        str, typer.Argument(help="Recipe with Mamba2 sublayers (its shapes are used).")
    ] = "1b-mamba-mla",
    batch: Annotated[
        int | None, typer.Option("--batch", "-b", min=1, help="Sequences (default: the micro batch).")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", min=8, help="Tokens per sequence (default: the recipe's).")
    ] = None,
    repeats: Annotated[int, typer.Option("--repeats", "-n", min=1, help="Timed calls per row.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed calls first.")] = 3,
    json_: JsonOpt = False,
) -> None:
    """Mamba2 scan forward and forward+backward time on FLA's and mamba-ssm's kernels (GPU), and auto's choice."""
    from zebra.bench.ssd import run_ssd_bench

    with out.progress("ssd bench", unit="row") as bar:
        report = run_ssd_bench(
            recipe, batch=batch, seq_len=seq_len, warmup=warmup, repeats=repeats, on_progress=bar
        )
    if json_:
        out.json(report.to_dict())
        return
    cols = [
        "backend",
        "chunk",
        "forward ms",
        "fwd+bwd ms",
        f"x{report.mamba_sublayers} sublayers ms",
        "rel err vs fla",
    ]
    rows = [
        [r.backend, str(r.chunk_size or "-"), "-", "-", "-", r.error]
        if r.error
        else [
            r.backend,
            str(r.chunk_size or "-"),
            f"{r.forward_ms:.3f}",
            f"{r.forward_backward_ms:.3f}",
            f"{r.forward_backward_ms * report.mamba_sublayers:.1f}",
            f"{r.rel_err_vs_fla:.1e}",
        ]
        for r in report.rows
    ]
    out.table(
        cols,
        rows,
        title=f"Mamba2 scan: {report.recipe} shapes (B={report.batch} T={report.seq_len} H={report.heads} "
        f"P={report.head_dim} G={report.groups} N={report.state_dim}) on {report.device}",
        justify={c: "right" for c in cols[2:5]},
    )
    best = report.fastest
    out.text(
        f"auto runs: {report.auto} (mamba-ssm chunk {report.auto_chunk}); fastest scan alone: "
        + ("none" if best is None else f"{best.backend} {best.chunk_size or ''}".strip())
    )
    if report.advice:
        out.text(
            f"to make auto take it: {report.advice} (auto follows the whole step: compare `zebra bench train "
            f"{report.recipe} --set model.kernel_backend=fla` and `=mamba_ssm` first)"
        )
