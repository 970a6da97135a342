"""`zebra bench parity`: zebra's model and FLA's own class trained from the same weights on the same batches.

Both models start from one initialisation: the trainer's `build_model` (seeded by train.seed) for zebra, and
those very tensors renamed into FLA's GatedDeltaNetForCausalLM / KDAForCausalLM by `--to fla`'s key map
(`zebra.convert.fla_format.fla_state_dict`). Both then train `steps` optimizer steps on one device with the trainer's
step (`zebra.bench.train.make_step`: the recipe's precision, AdamW, clipping and warm-up + decay schedule over
`steps`), one micro-batch of `batch` sequences per step, each on its own loss path:
- zebra: the trainer's chunked linear cross-entropy (`zebra.train.step.zebra_loss_sum`);
- FLA: its model's own `labels=` loss (`zebra.bench.train.labels_loss_sum`).

The batches are a convert-fla folder's chunks in FLA's order for one rank (`data.order: fla`,
`zebra.data.fla_order`), built once and fed to both models: each chunk's last position has no target, as FLA
scores it, so both losses are the mean over the same T-1 targets per sequence.

Written to `output/`: `parity.json` (both curves and the differences), `parity.png` (both curves, drawn by
`zebra plot`'s code) and `zebra/metrics.jsonl`, `fla/metrics.jsonl` (one `{"step", "loss"}` line per step).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zebra.core.errors import ZebraError


@dataclass(kw_only=True)
class ParityConfig:
    """Arguments of one parity run (see `zebra bench parity --help`)."""

    recipe: str
    data: str  # a convert-fla folder
    steps: int = 200
    batch: int = 8  # sequences per step
    output: Path = Path("parity")
    overrides: list[str] = field(default_factory=list)


@dataclass
class ParityReport:
    recipe: str
    data: str
    device: str
    precision: str
    steps: int
    batch: int
    seq_len: int
    params: int
    fla_class: str
    torch_version: str
    zebra_loss: list[float]  # per step, the mean CE over the step's targets
    fla_loss: list[float]

    @property
    def step1_diff(self) -> float:
        """|zebra - FLA| of the first step's loss (the same weights, before any update)."""
        return abs(self.zebra_loss[0] - self.fla_loss[0])

    @property
    def max_rel_diff(self) -> float:
        """The largest |zebra - FLA| / FLA over all steps."""
        return max(abs(z - f) / abs(f) for z, f in zip(self.zebra_loss, self.fla_loss, strict=True))

    @property
    def final_rel_diff(self) -> float:
        """|zebra - FLA| / FLA of the last step's loss."""
        return abs(self.zebra_loss[-1] - self.fla_loss[-1]) / abs(self.fla_loss[-1])

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "step1_diff": self.step1_diff,
            "max_rel_diff": self.max_rel_diff,
            "final_rel_diff": self.final_rel_diff,
        }


def parity_recipe(cfg: ParityConfig):
    """The recipe both models train with: `cfg.recipe` on `cfg.data` in FLA's order, `cfg.batch` sequences per
    step on one rank, a schedule over `cfg.steps` steps.

    Raises:
        ZebraError: a recipe FLA has no class for, data convert-fla did not write (or of another sequence length),
            or a model vocabulary smaller than the data's tokenizer.
    """
    from zebra.bench.train import check_fla_comparable
    from zebra.recipes import load_recipe
    from zebra.recipes.loader import parse_assignments
    from zebra.train.data import fla_dataset

    recipe = load_recipe(
        cfg.recipe,
        overrides={
            **parse_assignments(cfg.overrides),
            "data.paths": [cfg.data],
            "data.mock": False,
            "data.order": "fla",
            "train.global_batch_size": cfg.batch,
            "train.micro_batch_size": cfg.batch,
            "train.max_steps": cfg.steps,
        },
    )
    check_fla_comparable(recipe, flag="bench parity")
    vocab = fla_dataset(recipe, cfg.steps * cfg.batch, ranks=1).folder.manifest.tokenizer.get("vocab_size")
    if vocab and vocab > recipe.model.vocab_size:
        raise ZebraError(
            f"--data {cfg.data}: tokenized with {vocab} ids, but model.vocab_size is {recipe.model.vocab_size}",
            fix=f"--set model.vocab_size={vocab}",
        )
    return recipe


def parity_batches(recipe, steps: int) -> list[dict[str, Any]]:
    """The `steps` micro-batches (one per step, [batch, T] each) the trainer reads on one rank in FLA's order."""
    import torch

    from zebra.train.data import fla_dataset, micro_batches
    from zebra.train.dist import DistEnv

    G = recipe.train.global_batch_size
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    batches = micro_batches(
        fla_dataset(recipe, steps * G, ranks=1),
        start=0,
        stop=steps * G,
        global_batch=G,
        micro_batch=G,
        env=env,
        num_workers=0,
    )
    return list(batches)


def train_losses(step, batches: list[dict[str, Any]], on_step: Callable[[int], None]) -> list[float]:
    """Run `step` (a `TrainStep`) once per batch; the loss of every step."""
    losses = []
    for i, batch in enumerate(batches):
        losses.append(step([batch]).loss)
        on_step(i + 1)
    return losses


def run_parity(
    cfg: ParityConfig, *, on_progress: Callable[[float, float | None, str], None] | None = None
) -> ParityReport:
    """Train zebra's model, then FLA's, from the same weights on the same batches; write the report.

    `on_progress(done, total, note)` is called after every step of either model (total: both models' steps).
    """
    progress = on_progress or (lambda _done, _total, _note: None)
    import torch

    from zebra.bench.train import check_fla_comparable, fla_model, labels_loss_sum, make_step
    from zebra.convert.fla_format import fla_state_dict
    from zebra.train.trainer import build_model

    recipe = parity_recipe(cfg)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    check_fla_comparable(recipe, device, flag="bench parity")
    batches = parity_batches(recipe, cfg.steps)

    zebra = build_model(recipe, device)
    initial = {k: v.detach().to("cpu", copy=True) for k, v in zebra.state_dict().items()}
    params = sum(p.numel() for p in zebra.parameters())
    progress(0, 2 * cfg.steps, "zebra")
    zebra_loss = train_losses(
        make_step(zebra, recipe, device, schedule=True),
        batches,
        lambda done: progress(done, 2 * cfg.steps, "zebra"),
    )
    del zebra
    gc.collect()
    torch.cuda.empty_cache()

    fla = fla_model(recipe, device)
    fla.load_state_dict(fla_state_dict(initial), strict=True)
    fla_class = type(fla).__name__
    del initial
    step = make_step(fla, recipe, device, loss_fn=labels_loss_sum, schedule=True)
    fla_loss = train_losses(step, batches, lambda done: progress(cfg.steps + done, 2 * cfg.steps, fla_class))
    report = ParityReport(
        recipe=recipe.name,
        data=str(cfg.data),
        device=torch.cuda.get_device_name(device),
        precision=recipe.train.precision,
        steps=cfg.steps,
        batch=cfg.batch,
        seq_len=recipe.data.seq_len,
        params=params,
        fla_class=fla_class,
        torch_version=torch.__version__,
        zebra_loss=zebra_loss,
        fla_loss=fla_loss,
    )
    write_parity(report, Path(cfg.output))
    return report


def write_parity(report: ParityReport, output: Path) -> dict[str, Path]:
    """`output/parity.json`, the two runs' `metrics.jsonl` and `output/parity.png`, each written atomically.

    Returns:
        {"json": ..., "png": ...}
    """
    from zebra.core.atomic import make_folder, write_atomic
    from zebra.train.plot import plot_runs

    runs = []
    for name, losses in (("zebra", report.zebra_loss), ("fla", report.fla_loss)):
        run = output / name
        make_folder(run)
        lines = (json.dumps({"step": i + 1, "loss": loss}) for i, loss in enumerate(losses))
        write_atomic(run / "metrics.jsonl", "\n".join(lines) + "\n")
        runs.append(run)
    write_atomic(output / "parity.json", json.dumps(report.to_dict(), indent=2) + "\n")
    return {"json": output / "parity.json", "png": plot_runs(runs, output / "parity.png")}
