"""`zebra eval`: lm-eval-harness benchmarks on a zebra export, an FLA directory or a training run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zebra.cli._options import DeviceOpt, JsonOpt, examples, tokenizer_option
from zebra.cli._output import out
from zebra.core.atomic import output_folder
from zebra.folders.model_folder import model_path

EXAMPLES = examples(
    "zebra eval runs/tiny --tasks zebra --limit 100",
    "zebra eval export/ --tasks arc_easy,piqa --num-fewshot 0 --batch-size auto --output results/",
    "zebra eval export/ --tasks my_task --include-path my_tasks/ --device cpu",
    "zebra eval zebra-1b --tokenizer meta-llama/Llama-3.2-1B   # an export converted without tokenizer files",
)


def eval_command(
    model: Annotated[str, typer.Argument(help="Export directory, FLA directory or training run directory.")],
    tasks: Annotated[
        str,
        typer.Option(
            "--tasks",
            "-t",
            help="Comma-separated lm-eval tasks, task YAML paths, or the preset `zebra` "
            "(arc_easy, arc_challenge, hellaswag, mmlu, openbookqa, piqa, race, winogrande).",
        ),
    ] = "zebra",
    num_fewshot: Annotated[
        int | None, typer.Option("--num-fewshot", min=0, help="Few-shot examples (default: each task's).")
    ] = None,
    batch_size: Annotated[
        str | None,
        typer.Option(
            "--batch-size", help="An integer, `auto` or `auto:N` (default: auto on a GPU, 1 on CPU)."
        ),
    ] = None,
    limit: Annotated[
        float | None, typer.Option("--limit", help="Examples per task (an integer, or a fraction below 1).")
    ] = None,
    device: DeviceOpt = None,
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (the checkpoint's), bf16, fp16, fp32.")
    ] = "auto",
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Folder for lm-eval's results.json (written atomically)."),
    ] = None,
    include_path: Annotated[
        list[Path] | None, typer.Option("--include-path", help="Folder of local task YAMLs (repeatable).")
    ] = None,
    tokenizer: Annotated[str | None, tokenizer_option("the model's")] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed for lm-eval's samplers and few-shot draws.")
    ] = 1234,
    json_: JsonOpt = False,
) -> None:
    """Evaluate MODEL on lm-eval-harness tasks and print one row per task and metric."""
    model_path(model)  # told before the model library is imported
    req_args = dict(num_fewshot=num_fewshot, batch_size=batch_size, limit=limit, device=device, dtype=dtype,
                    include_path=include_path or [], tokenizer=tokenizer, seed=seed)  # fmt: skip
    if not output:
        return _show(*_evaluate(model, tasks, req_args, None), json_)
    yamls = [t for t in tasks.split(",") if t.strip().endswith((".yaml", ".yml"))]
    read = [("the model", model), *(("--include-path", p) for p in include_path or []),
            *(("--tasks", t) for t in yamls)]  # fmt: skip
    # checked before the evaluation (and lm-eval's import): its results must have somewhere to go; a failed
    # evaluation leaves no empty folder behind
    with output_folder(output, read, harm="results.json would be written among the files evaluated",
                       fix="choose another --output (a folder for results.json)"):  # fmt: skip
        results, written = _evaluate(model, tasks, req_args, output)
    _show(results, written, json_)


def _evaluate(model: str, tasks: str, req_args: dict, output: Path | None) -> tuple[dict, Path | None]:
    """lm-eval's results for MODEL, and where they were written (OUTPUT/results.json; None without OUTPUT)."""
    from zebra.eval import EvalRequest, expand_tasks, run_eval, write_results

    results = run_eval(EvalRequest(model=model, tasks=expand_tasks(tasks), **req_args), on_note=out.note)
    return results, write_results(results, output) if output else None


def _show(results: dict, written: Path | None, json_: bool) -> None:
    from zebra.eval import metric_rows

    rows = metric_rows(results)
    if json_:
        out.json({"rows": rows, "results_file": str(written) if written else None})
        return
    out.table(
        ["task", "n-shot", "metric", "value", "± stderr"],
        [[r["task"], r["n_shot"], r["metric"], _num(r["value"]), _num(r["stderr"])] for r in rows],
        title=f"lm-eval on {results['zebra']['model']}",
        justify={"value": "right", "± stderr": "right", "n-shot": "right"},
    )
    if written:
        out.result(f"wrote {written}")


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}" if abs(v) < 1e5 else f"{v:.4g}"
