"""Evaluation through lm-eval-harness: task presets, local task YAMLs, results as lm-eval's JSON."""

from zebra.eval.harness import EvalRequest, metric_rows, run_eval, write_results
from zebra.eval.tasks import PRESETS, ZEBRA_SUITE, expand_tasks

__all__ = [
    "PRESETS",
    "ZEBRA_SUITE",
    "EvalRequest",
    "expand_tasks",
    "metric_rows",
    "run_eval",
    "write_results",
]
