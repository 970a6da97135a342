"""`zebra eval`: lm-eval-harness on a zebra, FLA or HF model, through lm-eval's own HF model class.

The model types are registered with transformers' Auto classes (`import zebra.models`, `import fla`), so
lm-eval's `HFLM` loads the directory with `AutoModelForCausalLM` exactly as `lm_eval --model hf` would: the
numbers are lm-eval's, with no wrapper model and no patched constructors.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebra.core.atomic import make_folder, write_atomic
from zebra.core.device import resolve_device, resolve_dtype
from zebra.core.errors import ZebraError
from zebra.data.tokenizers import load_tokenizer
from zebra.eval.tasks import load_tasks, task_manager, template_error
from zebra.generation.finite import check_logits_on_forward
from zebra.generation.loading import (
    check_finite_weights,
    machine_kernels,
    register_model_types,
    resolve_model_dir,
    tokenizer_source,
)


@dataclass(kw_only=True)
class EvalRequest:
    """One `zebra eval` call.

    Attributes:
        model: export / FLA / HF / run directory.
        tasks: lm-eval task names, presets already expanded (see `zebra.eval.tasks.expand_tasks`), or YAML paths.
        num_fewshot: few-shot examples (None: each task's default).
        batch_size: an int, `auto` or `auto:N` (lm-eval's automatic batch size); None: auto on a GPU, 1 on CPU
            (lm-eval's probe runs full-length batches, which takes long on a CPU).
        limit: examples per task (a whole number, or a fraction < 1); None for all.
        device: torch device; default cuda when available.
        dtype: auto / bf16 / fp16 / fp32 / fp64.
        include_path: folders of local task YAMLs.
        tokenizer: the tokenizer to use instead of the model's own (a name, hub id, folder or `byte`).
        seed: lm-eval's random, numpy, torch and few-shot seeds.
    """

    model: str
    tasks: list[str]
    num_fewshot: int | None = None
    batch_size: str | None = None
    limit: float | None = None
    device: str | None = None
    dtype: str = "auto"
    include_path: list[Path] = field(default_factory=list)
    tokenizer: str | None = None
    seed: int = 1234

    def __post_init__(self) -> None:
        self.limit = parse_limit(self.limit)


def run_eval(req: EvalRequest, on_note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run lm-eval's `simple_evaluate` on `req.model` and return its results dict (without per-sample logs).

    `on_note` is told when a run directory's export is written first (`resolve_model_dir`).

    Raises:
        ZebraError: bad model directory, unknown task, dataset not reachable offline, bad flag value.
    """
    from lm_eval.models.huggingface import HFLM

    model_dir = resolve_model_dir(req.model, on_note)
    register_model_types(model_dir)
    tokenizer_from = tokenizer_source(
        model_dir, req.tokenizer
    )  # none at all: one line, before lm-eval starts
    # --tokenizer loads here (`byte` is zebra's); without it HFLM reads the folder's own, as `lm_eval` would
    tokenizer = load_tokenizer(req.tokenizer) if req.tokenizer is not None else None
    device = resolve_device(req.device)
    dtype = resolve_dtype(req.dtype, device)  # None: the checkpoint's, which HFLM calls "auto"
    batch_size = parse_batch_size(req.batch_size or ("auto" if device.startswith("cuda") else "1"))

    manager = task_manager(req.include_path)
    tasks = load_tasks(req.tasks, manager)
    with contextlib.redirect_stdout(sys.stderr):  # lm-eval prints progress notes; stdout stays the results'
        lm = HFLM(
            pretrained=str(model_dir.path),
            backend="causal",
            device=device,
            dtype=dtype or "auto",
            batch_size=batch_size,
            tokenizer=tokenizer,
            **machine_kernels(model_dir),
        )
        check_finite_weights(lm.model, model_dir.path)
        check_logits_on_forward(lm.model)  # finite weights can still overflow: one line, not acc 0.5
        results = _evaluate(lm, tasks, manager, req)
    results.pop("samples", None)
    results["zebra"] = {
        "model": str(model_dir.path),
        "model_type": model_dir.model_type,
        "source": model_dir.source,
        "tokenizer": tokenizer_from,
    }
    return results


def _evaluate(lm: Any, tasks: list[Any], manager: Any, req: EvalRequest) -> dict[str, Any]:
    import jinja2
    import lm_eval

    try:
        with _quiet_git_probe():
            return lm_eval.simple_evaluate(
                model=lm,
                tasks=tasks,
                num_fewshot=req.num_fewshot,
                limit=req.limit,
                task_manager=manager,
                log_samples=False,
                random_seed=req.seed,
                numpy_random_seed=req.seed,
                torch_random_seed=req.seed,
                fewshot_random_seed=req.seed,
            )
    # a template that renders on a task's first document (checked when it was built) but fails on a later one
    except jinja2.TemplateError as e:
        raise template_error(req.tasks, manager, e) from None


@contextlib.contextmanager
def _quiet_git_probe() -> Iterator[None]:
    """lm-eval records `git describe --always` of the current folder as the results' `git_hash`, running git with
    our stderr: outside a repository git prints 'fatal: not a git repository' there. lm-eval's own probe still
    runs and gives the same hash, with file descriptor 2 (which git inherits) on /dev/null for its duration."""
    from unittest import mock

    import lm_eval.evaluator

    from zebra.core.stderr import fd2_to

    probe = lm_eval.evaluator.get_git_commit_hash

    def quiet_probe() -> str | None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            with fd2_to(devnull):
                return probe()
        finally:
            os.close(devnull)

    with mock.patch.object(lm_eval.evaluator, "get_git_commit_hash", quiet_probe):
        yield


def parse_limit(limit: float | None) -> int | float | None:
    """`--limit`: a whole number of examples per task, or a fraction of each task below 1 (None: all)."""
    if limit is None:
        return None
    if limit <= 0 or (limit >= 1 and limit != int(limit)):
        raise ZebraError(
            f"--limit {limit}: not a positive integer or a fraction below 1", fix="e.g. --limit 100"
        )
    return limit if limit < 1 else int(limit)


def parse_batch_size(value: str) -> int | str:
    """`auto`, `auto:N` or a positive int."""
    if value == "auto" or (value.startswith("auto:") and value[5:].isdigit()):
        return value
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise ZebraError(
        f"--batch-size {value}: not a positive integer or auto", fix="pass e.g. --batch-size 8 or auto"
    )


def metric_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (task, metric): task, n-shot, metric, filter, value, stderr (None when not computed)."""
    rows = []
    n_shot = results.get("n-shot", {})
    for section in ("results", "groups"):
        for task, metrics in results.get(section, {}).items():
            if section == "groups" and task in results.get("results", {}):
                continue
            for key, value in sorted(metrics.items()):
                metric, _, filt = key.partition(",")
                if not filt or metric.endswith("_stderr") or not isinstance(value, int | float):
                    continue
                stderr = metrics.get(f"{metric}_stderr,{filt}")
                rows.append(
                    {
                        "task": metrics.get("alias", task),
                        "n_shot": n_shot.get(task),
                        "metric": metric,
                        "filter": filt,
                        "value": float(value),
                        "stderr": float(stderr) if isinstance(stderr, int | float) else None,
                    }
                )
    return rows


def write_results(results: dict[str, Any], output: Path) -> Path:
    """Write `results` to OUTPUT/results.json atomically (temp name, then rename); returns the path."""
    from lm_eval.utils import handle_non_serializable

    make_folder(output, fix="choose another --output (a folder for results.json)")
    target = output / "results.json"
    write_atomic(
        target, json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n"
    )
    return target
