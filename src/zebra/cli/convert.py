"""`zebra convert` and `zebra verify`: move checkpoints between Zebra, FLA and Primus-Megatron formats, and prove it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zebra.cli._options import DeviceOpt, ForceOpt, JsonOpt, YesOpt, examples, tokenizer_option
from zebra.cli._output import out
from zebra.cli._prompt import choose_found, confirm_overwrite
from zebra.core.errors import ZebraError
from zebra.folders.model_folder import existing_path

CONVERT_EXAMPLES = examples(
    "zebra convert runs/1b-gdn-pure                       # a run's latest checkpoint -> runs/1b-gdn-pure/export",
    "zebra convert --to fla                               # the run under runs/ with the newest checkpoint",
    "zebra convert primus/checkpoints --output zebra-1b   # Primus torch / torch_dist -> Zebra HF export",
    "zebra convert zebra-1b --to fla --output fla-1b      # pure GDN / KDA -> FLA GatedDeltaNet / KDA",
    "zebra convert fla-1b --to hf --dtype bf16 --force",
    "zebra convert runs/tiny-gdn --to qwen3-next          # -> Qwen3NextForCausalLM, no trust_remote_code",
    "zebra convert runs/tiny-gdn --to gguf                # -> runs/tiny-gdn.gguf: llama-server -m runs/tiny-gdn.gguf",
)
VERIFY_EXAMPLES = examples(
    "zebra verify zebra-1b --against primus/checkpoints",
    "zebra verify fla-1b --against zebra-1b --json",
    'zebra verify zebra-1b --prompt "Once upon a time" --device cpu',
    "zebra verify runs/tiny-gdn.gguf --against runs/tiny-gdn   # llama.cpp's logits and greedy tokens",
)


def convert(
    src: Annotated[
        Path | None,
        typer.Argument(
            help="Zebra run / checkpoint / export, FLA directory, or Primus-Megatron checkpoint (default: the run "
            "under runs/ with the newest checkpoint; a pick on a terminal when there are several).",
            show_default=False,
        ),
    ] = None,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="hf (= zebra): a Zebra HF export; fla: FLA's layout; transformers' own classes: qwen3-next, "
            "qwen3.5 (GDN), bamba, granite-hybrid (Mamba2), kimi-linear (KDA + NoPE MLA); gguf: one file for "
            "llama.cpp.",
        ),
    ] = "hf",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Output directory (default: <run>/export, or SRC-hf / SRC-fla / SRC-TO); --to gguf: the file "
            "(default SRC.gguf).",
        ),
    ] = None,
    from_: Annotated[
        str, typer.Option("--from", help="Source format: auto, zebra (run), hf (export), fla, megatron.")
    ] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="auto (keep), bf16, fp16, fp32.")] = "auto",
    tokenizer: Annotated[str | None, tokenizer_option("the source's; none ships no tokenizer")] = None,
    max_shard_size: Annotated[
        str, typer.Option("--max-shard-size", help="Largest safetensors shard, e.g. 5GB, 500MB.")
    ] = "5GB",
    gguf_type: Annotated[
        str,
        typer.Option(
            "--gguf-type",
            help="--to gguf: f32 (exact), f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0, or the k-quants q6_k, "
            "q5_k_m, q5_k_s, q4_k_m, q4_k_s (llama.cpp's quantizer; needs llama-cpp-python).",
        ),
    ] = "f32",
    force: ForceOpt = False,
    yes: YesOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Convert a checkpoint, streaming one tensor at a time into sharded safetensors (or one GGUF file)."""
    if src is None:
        src = _newest_run(yes)
    existing_path(src)  # told before the model library is imported
    from zebra.convert.formats import detect_format
    from zebra.convert.pipeline import TARGETS, check_output_apart, default_output
    from zebra.convert.pipeline import convert as run_convert
    from zebra.core.atomic import sigterm_raises

    if to not in TARGETS:
        raise ZebraError(f"--to {to}: unknown target", fix=f"use one of {', '.join(TARGETS)}")
    fmt = detect_format(src) if from_ == "auto" else from_
    target = output or default_output(src, to, fmt, gguf_type)
    check_output_apart(src, target, to, fmt)
    # a GGUF output is one file: the library replaces only a GGUF file, with --force or --yes
    force = force or yes if to == "gguf" else confirm_overwrite(target, force=force, yes=yes)
    with sigterm_raises("convert"), out.progress("converting", unit="B", enabled=not json_) as bar:
        result = run_convert(
            src,
            to,
            target,
            fmt=fmt,
            dtype=dtype,
            force=force,
            tokenizer=tokenizer,
            max_shard_size=max_shard_size,
            gguf_type=gguf_type,
            on_progress=bar,
        )
    if json_:
        out.json(result.to_dict())
        return
    for note in result.notes:
        out.warn(note)
    step = f", step {result.step}" if result.step is not None else ""
    out.result(
        f"{result.source} ({result.source_format}{step}) -> {result.output} ({result.target}): "
        f"{result.tensors} tensors, pattern {result.pattern}"
    )
    if result.target == "gguf":
        out.hint(f"serve it: llama-server -m {result.output}")
    else:
        out.hint(f"check it: zebra verify {result.output} --against {result.source}")


def _newest_run(yes: bool) -> Path:
    from zebra.folders.discover import find_runs

    cwd = Path.cwd()
    runs = [str(p.relative_to(cwd)) for p in find_runs(cwd)]
    fix = (
        "pass SOURCE: a run, checkpoint, export, FLA or Megatron folder (no run under runs/ has a checkpoint)"
    )
    return Path(choose_found("Convert which run?", runs, yes=yes, flag="SOURCE", fix=fix))


def verify(
    directory: Annotated[
        Path,
        typer.Argument(
            help="The converted checkpoint (Zebra export, FLA directory, transformers-native export, or a .gguf "
            "file, run by llama-cpp-python)."
        ),
    ],
    against: Annotated[
        Path | None, typer.Option("--against", "-a", help="The source it was converted from (any format).")
    ] = None,
    prompts: Annotated[
        list[str] | None, typer.Option("--prompt", "--prompts", "-p", help="Prompt text (repeatable).")
    ] = None,
    device: DeviceOpt = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, max=256, help="Greedy continuation length.")
    ] = 12,
    tokenizer: Annotated[str | None, tokenizer_option("the directory's")] = None,
    json_: JsonOpt = False,
) -> None:
    """Audit names and shapes, compare logits with the source, and show a greedy sample; exit 1 on failure."""
    existing_path(directory)  # told before the model library is imported
    if against is not None:
        existing_path(against, what="--against")
    from zebra.convert.verifier import DEFAULT_PROMPTS
    from zebra.convert.verifier import verify as run_verify

    texts = tuple(prompts) if prompts else DEFAULT_PROMPTS
    if directory.is_file() and directory.suffix == ".gguf":  # llama.cpp (llama-cpp-python) runs it
        from zebra.convert.gguf_verify import verify_gguf

        report = verify_gguf(directory, against, texts, max_new_tokens)
    else:
        report = run_verify(
            directory,
            against=against,
            prompts=texts,
            device=device,
            max_new_tokens=max_new_tokens,
            tokenizer=tokenizer,
        )
    if json_:
        out.json(report.to_dict())
    else:
        _render(report)
    if not report.ok:
        raise typer.Exit(1)


def _render(report) -> None:
    out.text(f"[bold]{report.directory}[/] ({report.format}) on {report.device}: {report.mode}")
    rows = []
    for a in report.audits:
        problems = (
            [f"missing {n}" for n in a.missing]
            + [f"unexpected {n}" for n in a.unexpected]
            + [f"{n}: {g} != {e}" for n, g, e in a.mismatched]
        )
        rows.append(
            [
                a.subject or report.directory,
                a.target,
                a.checked,
                "[green]ok[/]" if a.ok else "[red]FAIL[/]",
                "; ".join(problems[:6]) + (f" (+{len(problems) - 6})" if len(problems) > 6 else ""),
            ]
        )
    out.table(
        ["checkpoint", "class", "tensors", "audit", "problems"],
        rows,
        title="Keys and shapes",
        justify={"tensors": "right"},
    )
    if report.parities:
        out.table(
            ["reference", "candidate", "max |diff|", "max rel", "cosine", "pass if", "result"],
            [
                [
                    p.reference,
                    p.candidate,
                    *(
                        [f"{p.max_abs:.3g}", f"{p.max_rel:.3g}", f"{p.cosine:.8f}"]
                        if p.problem is None
                        else ["-", "-", "-"]
                    ),
                    f"rel <= {p.threshold_rel:g}, cos >= {p.threshold_cosine}",
                    "[green]ok[/]" if p.ok else f"[red]FAIL[/]{f' ({p.problem})' if p.problem else ''}",
                ]
                for p in report.parities
            ],
            title="Logits parity",
        )
    else:
        out.text("Logits parity: not run (pass --against SRC)")
    out.table(
        ["rank", "token", "text", "prob"],
        [
            [i + 1, t["id"], repr(t["text"]) if t["text"] is not None else "", f"{t['prob']:.4f}"]
            for i, t in enumerate(report.top5)
        ],
        title=f"Next token after {report.prompt!r}",
        justify={"prob": "right", "token": "right"},
    )
    out.text(f"greedy: {report.prompt!r} -> {report.continuation!r}")
    for note in report.notes:
        out.warn(note)
    for problem in report.problems:
        out.warn(problem)
    if report.ok:
        out.result("verified")
    else:
        out.error("verification failed")
