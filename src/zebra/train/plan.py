"""What a `zebra train` invocation will do, decided before any rank starts: the resolved recipe, ranks,
gradient accumulation, data and run directory. `--dry-run` prints it; `prepare_run` writes the run directory.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebra.errors import ZebraError
from zebra.recipes import Recipe

RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "loss.png", "export", "tensorboard", "data_cache")


@dataclass
class RunPlan:
    recipe: Recipe
    run_dir: Path
    device: str  # "cuda" or "cpu"
    nodes: int
    procs_per_node: int
    micro_batch: int
    accumulation: int
    resume: str  # auto | never | a checkpoint path
    rdzv_endpoint: str | None = None
    checkpoint_step: int | None = None  # the newest checkpoint already in run_dir
    changed: list[str] = field(default_factory=list)  # recipe keys that differ from run_dir/config.yaml

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def in_process(self) -> bool:
        """One rank: train in this process (no launcher, no process group)."""
        return self.world_size == 1

    def summary(self) -> dict[str, Any]:
        t, d = self.recipe.train, self.recipe.data
        return {
            "recipe": self.recipe.name,
            "source": self.recipe.source,
            "run_dir": str(self.run_dir),
            "device": self.device,
            "nodes": self.nodes,
            "ranks_per_node": self.procs_per_node,
            "world_size": self.world_size,
            "micro_batch": self.micro_batch,
            "accumulation": self.accumulation,
            "global_batch": t.global_batch_size,
            "seq_len": d.seq_len,
            "tokens_per_step": t.global_batch_size * d.seq_len,
            "max_steps": t.max_steps,
            "data": "mock (megatron MockGPTDataset)" if d.mock else d.paths,
            "tokenizer": d.tokenizer,
            "resume": self.resume,
            "checkpoint_step": self.checkpoint_step,
            "rdzv_endpoint": self.rdzv_endpoint,
        }


def _data_overrides(data: list[str] | None, mock_data: bool, max_steps: int | None) -> list[str]:
    if data and mock_data:
        raise ZebraError("--data and --mock-data exclude each other", fix="pass one of them")
    sets = []
    if data:
        if any("," in d for d in data):
            raise ZebraError(
                f"--data {data}: a prefix may not contain ','", fix="repeat --data for each prefix"
            )
        sets.append("data.paths=" + ",".join(data))
        sets.append("data.mock=false")
    if mock_data:
        sets += ["data.mock=true", "data.paths=[]"]
    if max_steps is not None:
        sets.append(f"train.max_steps={max_steps}")
    return sets


def resolve_data(recipe: Recipe) -> None:
    """Replace `data.paths` by absolute Megatron prefixes with weights (tokenizing `@sample` on first use)."""
    if recipe.data.mock:
        return
    if not recipe.data.paths:
        raise ZebraError(
            f"recipe {recipe.name} has no training data (data.paths is empty)",
            fix="pass --data PREFIX[:weight] (made by `zebra data prep`), --data @sample, or --mock-data",
        )
    from zebra.data import resolve_prefixes

    if recipe.data.order == "fla":  # a one-line error now, not on every rank
        from zebra.data.fla_order import fla_folder

        fla_folder(recipe.data.paths, recipe.data.seq_len, recipe.train.global_batch_size)
    _check_vocab(recipe)
    resolved = []
    for entry in recipe.data.paths:
        _check_manifest_tokenizer(entry, recipe)
        for prefix, weight in resolve_prefixes(entry, tokenizer=recipe.data.tokenizer):
            resolved.append(f"{Path(prefix).resolve()}:{weight!r}")
    recipe.data.paths = resolved


def _check_vocab(recipe: Recipe) -> None:
    from zebra.data import load_tokenizer

    vocab = len(load_tokenizer(recipe.data.tokenizer))
    if vocab > recipe.model.vocab_size:
        raise ZebraError(
            f"data.tokenizer {recipe.data.tokenizer} has {vocab} ids but model.vocab_size is "
            f"{recipe.model.vocab_size}",
            fix=f"--set model.vocab_size={vocab} (or larger), or use the recipe's tokenizer",
        )


def _check_manifest_tokenizer(entry: str, recipe: Recipe) -> None:
    """Data prepared with another tokenizer than the recipe's would train on meaningless ids: refuse it."""
    from zebra.data import read_manifest
    from zebra.train.data import parse_blend

    target = Path(parse_blend([entry])[0][0]).expanduser()
    folder = target.parent if target.name == "manifest.json" else target
    if not (folder / "manifest.json").is_file():
        return
    name = read_manifest(folder).tokenizer.get("name")
    if name and name != recipe.data.tokenizer:
        raise ZebraError(
            f"--data {entry}: tokenized with {name}, but the recipe trains with {recipe.data.tokenizer}",
            fix=f"--set data.tokenizer={name} (with a model.vocab_size that covers it), or prepare the data "
            f"again with --tokenizer {recipe.data.tokenizer}",
        )


def _ranks(gpus: int | None, nproc: int | None, recipe: Recipe) -> tuple[str, int]:
    """(device, ranks per node) from the flags and the GPUs this machine shows."""
    import torch

    if gpus is not None and nproc is not None:
        raise ZebraError(
            "--gpus and --nproc exclude each other", fix="--gpus for GPU ranks, --nproc for CPU ranks"
        )
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if nproc is not None:
        return "cpu", nproc
    wanted = recipe.launch.gpus if gpus is None else gpus
    if gpus is not None and visible == 0:
        raise ZebraError(f"--gpus {gpus}: no GPU is visible here", fix="train on CPU ranks with --nproc N")
    if visible == 0:
        return "cpu", 1
    if wanted > visible:
        raise ZebraError(
            f"--gpus {wanted}: only {visible} GPU(s) visible", fix=f"pass --gpus {visible} or fewer"
        )
    return "cuda", wanted or visible


def make_plan(
    recipe_name: str | Path,
    *,
    overrides: list[str] = (),
    data: list[str] | None = None,
    mock_data: bool = False,
    max_steps: int | None = None,
    output: str | Path = "runs",
    run: str | None = None,
    resume: str = "auto",
    gpus: int | None = None,
    nodes: int | None = None,
    nproc: int | None = None,
    rdzv_endpoint: str | None = None,
    ranks: Callable[[Recipe], tuple[str, int]] | None = None,
) -> RunPlan:
    """Resolve everything a run needs and check it, raising a one-line ZebraError for any problem.

    `ranks(recipe) -> (device, ranks per node)` counts the ranks where another launcher runs them (a container,
    Slurm's nodes), which also checks its own rendezvous; by default they are counted on this machine.
    """
    from zebra.recipes import dump_recipe, load_recipe
    from zebra.train import checkpoint as ckpt
    from zebra.train.data import batch_plan

    recipe = load_recipe(recipe_name, overrides=[*overrides, *_data_overrides(data, mock_data, max_steps)])
    device, per_node = ranks(recipe) if ranks else _ranks(gpus, nproc, recipe)
    nodes = nodes or recipe.launch.nodes
    if ranks is None and nodes > 1 and not rdzv_endpoint:
        raise ZebraError(
            f"--nodes {nodes}: the local launcher needs a rendezvous endpoint",
            fix="pass --rdzv-endpoint HOST:PORT (the same on every node), or launch through Slurm",
        )
    t = recipe.train
    micro, accumulation = batch_plan(t.global_batch_size, t.micro_batch_size, nodes * per_node)
    if resume not in ("auto", "never") and not Path(resume).exists():
        raise ZebraError(f"--resume {resume}: no such checkpoint", fix="pass auto, never or an existing path")
    run_dir = Path(output) / (run or recipe.name)
    resolve_data(recipe)
    found = ckpt.committed(run_dir / "checkpoints")
    plan = RunPlan(
        recipe=recipe,
        run_dir=run_dir,
        device=device,
        nodes=nodes,
        procs_per_node=per_node,
        micro_batch=micro,
        accumulation=accumulation,
        resume=resume,
        rdzv_endpoint=rdzv_endpoint,
        checkpoint_step=ckpt.read_meta(found[0])["step"] if found else None,
    )
    saved = run_dir / "config.yaml"
    if saved.is_file() and resume == "auto" and found:
        plan.changed = _changed_keys(saved, dump_recipe(recipe))
    return plan


def _changed_keys(saved: Path, new_yaml: str) -> list[str]:
    import yaml

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(d, dict):
            return {prefix: d}
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out

    old, new = flat(yaml.safe_load(saved.read_text()) or {}), flat(yaml.safe_load(new_yaml))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def has_outputs(run_dir: Path) -> bool:
    """True when `run_dir` holds results of an earlier run (checkpoints, metrics, export)."""
    return any((run_dir / name).exists() for name in RUN_OUTPUTS)


def prepare_run(plan: RunPlan, *, start_over: bool = False) -> Path:
    """Create the run directory and write the resolved recipe to `config.yaml` (atomically).

    Args:
        start_over: delete an earlier run's checkpoints, metrics and export first (`--resume never`).
    """
    from zebra.recipes import dump_recipe
    from zebra.train.checkpoint import write_atomic

    if start_over:
        for name in RUN_OUTPUTS:
            target = plan.run_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(plan.run_dir / "config.yaml", dump_recipe(plan.recipe))
    return plan.run_dir
