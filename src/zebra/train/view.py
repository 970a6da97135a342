"""What the trainer tells about a run while it trains: the callbacks of `TrainView`.

This class shows nothing (ranks other than 0 keep it as it is); a front end subclasses it to render the run
(`zebra.cli._output.RichTrainView`: a live progress bar on a terminal, one line per log step otherwise).
"""

from __future__ import annotations

from typing import Any


class TrainView:
    """Rank 0's view of a run. `begin` and `end` bracket the training loop; `note` and `warn` come any time."""

    def begin(self, *, step: int, total: int) -> None:
        """The loop starts (or resumes) at optimizer step `step` of `total`."""

    def log(self, record: dict[str, Any]) -> None:
        """A training record, as written to metrics.jsonl (`step`, `loss`, `lr`, `tokens_per_s`, `mfu`,
        `memory_gb`, `skipped_steps`, ...; distillation adds `kl`, `ce` (the student's) and `teacher_ce`)."""

    def validated(self, step: int, val_loss: float, teacher_val_loss: float | None) -> None:
        """The validation loss at `step`, and the teacher's on the same batches (distillation; else None)."""

    def note(self, message: str) -> None:
        """A line about the run: resumed from, saved, validation loss, exported."""

    def warn(self, message: str) -> None:
        """A problem the run survives: a checkpoint that did not load, a skipped step."""

    def end(self) -> None:
        """The loop is over (finished, stopped or failed)."""
