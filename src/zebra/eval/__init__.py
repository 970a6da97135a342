"""Evaluation through lm-eval-harness: task presets, local task YAMLs, results as lm-eval's JSON; and the held-out
CE of the upcycling figures (`zebra.eval.ce`).

Public API (imported lazily, so `import zebra.eval.ce` does not load the harness and torch with it):
    EvalRequest, run_eval, metric_rows, write_results    zebra.eval.harness
    PRESETS, ZEBRA_SUITE, expand_tasks                   zebra.eval.tasks
    heldout_ce                                           zebra.eval.ce
"""

from __future__ import annotations

from zebra.core.lazy import lazy_exports

_EXPORTS = {
    "EvalRequest": "zebra.eval.harness",
    "metric_rows": "zebra.eval.harness",
    "run_eval": "zebra.eval.harness",
    "write_results": "zebra.eval.harness",
    "PRESETS": "zebra.eval.tasks",
    "ZEBRA_SUITE": "zebra.eval.tasks",
    "expand_tasks": "zebra.eval.tasks",
    "heldout_ce": "zebra.eval.ce",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
