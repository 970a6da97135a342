"""One training run, resolved before any rank starts: the recipe (data prefixes made absolute), where its ranks
are (`RankLayout`), how each global batch splits over them, the run directory and the checkpoint it resumes.

    recipe = load_recipe("tiny", overrides=data_overrides(None, mock_data=True, max_steps=50))  # typed
    run = resolve_run(recipe, RankLayout("cpu", nodes=1, ranks_per_node=2))
    prepare_run(run)                       # RUN/config.yaml, which every rank reads

`--dry-run` prints `TrainRun.summary()`; `zebra.launch.make_plan` resolves the run for a launcher (which
counts the ranks where they will run).
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebra.core.atomic import write_atomic
from zebra.core.errors import ZebraError, reading
from zebra.core.locks import FolderLock
from zebra.data import load_tokenizer, read_manifest, resolve_prefixes
from zebra.data.paths import BUNDLED, DataPath, prep_folder
from zebra.data.prefixes import bundled_sample
from zebra.folders.checkpoint_dir import committed, find_checkpoints, newest_step, remove_checkpoints
from zebra.recipes import Recipe, dump_recipe, load_recipe
from zebra.spec import arch
from zebra.train.data import batch_plan, check_split_documents
from zebra.train.optim import check_optimizer_graph

RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "loss.png", "export", "tensorboard", "data_cache")


@dataclass(frozen=True)
class RankLayout:
    """Where the ranks of a run are: `nodes` x `ranks_per_node` ranks on `device`, meeting at `rdzv_endpoint`
    (None: one node's torchrun picks its own, or Slurm's first node)."""

    device: str  # cuda | cpu
    nodes: int
    ranks_per_node: int
    rdzv_endpoint: str | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def gpus_per_node(self) -> int:
        return self.ranks_per_node if self.device == "cuda" else 0

    def describe(self) -> str:
        """`2 node(s) x 8 cuda rank(s) = 16`."""
        return f"{self.nodes} node(s) x {self.ranks_per_node} {self.device} rank(s) = {self.world_size}"


@dataclass
class TrainRun:
    """A run ready to start: `prepare_run` writes it to `run_dir`, where every rank reads it back."""

    recipe: Recipe  # resolved: data.paths are `DataPath`s of absolute Megatron prefixes
    run_dir: Path
    ranks: RankLayout
    micro_batch: int
    accumulation: int
    resume: str  # auto | never | a checkpoint path
    checkpoint_step: int | None = None  # the newest checkpoint already in run_dir
    changed: list[str] = field(default_factory=list)  # recipe keys that differ from run_dir/config.yaml

    def summary(self) -> dict[str, Any]:
        t, d, ranks = self.recipe.train, self.recipe.data, self.ranks
        return {
            "recipe": self.recipe.name,
            "source": self.recipe.source,
            "run_dir": str(self.run_dir),
            "device": ranks.device,
            "nodes": ranks.nodes,
            "ranks_per_node": ranks.ranks_per_node,
            "world_size": ranks.world_size,
            "micro_batch": self.micro_batch,
            "accumulation": self.accumulation,
            "global_batch": t.global_batch_size,
            "seq_len": d.seq_len,
            "tokens_per_step": t.global_batch_size * d.seq_len,
            "max_steps": t.max_steps,
            "data": "mock (megatron MockGPTDataset)" if d.mock else [str(p) for p in d.paths],
            "tokenizer": d.tokenizer,
            "teacher": self.recipe.distill.teacher or None,
            "init": t.init or None,
            "resume": self.resume,
            "checkpoint_step": self.checkpoint_step,
            "rdzv_endpoint": ranks.rdzv_endpoint,
        }


def data_overrides(data: list[str] | None, mock_data: bool, max_steps: int | None) -> dict[str, Any]:
    """Typed recipe overrides for `zebra train --data / --mock-data / --max-steps`: each `--data` entry is
    handed on as one list item, which the recipe's schema parses into a `DataPath` (once)."""
    if data and mock_data:
        raise ZebraError("--data and --mock-data exclude each other", fix="pass one of them")
    sets: dict[str, Any] = {}
    if data:
        if any("," in d for d in data):  # `--set data.paths=a,b` splits there: one grammar for both
            raise ZebraError(
                f"--data {data}: a prefix may not contain ','", fix="repeat --data for each prefix"
            )
        sets |= {"data.paths": list(data), "data.mock": False}
    if mock_data:
        sets |= {"data.mock": True, "data.paths": []}
    if max_steps is not None:
        sets["train.max_steps"] = max_steps
    return sets


def resolve_data(recipe: Recipe, *, prepare_data: bool = True) -> None:
    """Replace `data.paths` by absolute Megatron prefixes with weights (tokenizing `@sample` on first use).

    Args:
        prepare_data: False (a dry run): write nothing; `@sample` not tokenized yet becomes the prefix it will
            be, checked with its document count (`zebra.data.prefixes.bundled_sample`).
    """
    if recipe.data.mock:
        return
    if not recipe.data.paths:
        raise ZebraError(
            f"recipe {recipe.name} has no training data (data.paths is empty)",
            fix="pass --data PREFIX[:weight] (made by `zebra data prep`), --data @sample, or --mock-data",
        )
    if recipe.data.order == "fla":  # a one-line error now, not on every rank
        from zebra.data.fla_order import fla_folder

        fla_folder(recipe.data.paths, recipe.data.seq_len, recipe.train.global_batch_size)
    _check_vocab(recipe)
    for path in recipe.data.paths:
        _check_manifest_tokenizer(path, recipe)
    # a dry run asks for `@sample` once: its prefix, and its document count where it is not written yet
    sample = None
    if not prepare_data and any(path.target == BUNDLED for path in recipe.data.paths):
        sample = bundled_sample(recipe.data.tokenizer, prepare=False)
    resolved = [
        DataPath(str(Path(prefix.target).resolve()), prefix.weight)
        for path in recipe.data.paths
        for prefix in resolve_prefixes(
            path, tokenizer=recipe.data.tokenizer, prepare=prepare_data, sample=sample
        )
    ]
    if recipe.data.order != "fla":  # before the run folder exists; FLA's order has no split
        unwritten = sample is not None and not sample.prepared  # no files to count its documents in
        check_split_documents(
            recipe,
            [prefix.target for prefix in resolved],
            eval_on=recipe.train.eval_interval > 0,
            documents={str(sample.prefix.resolve()): sample.documents} if unwritten else None,
        )
    recipe.data.paths = resolved  # config.yaml holds each as PREFIX:WEIGHT


def resolve_distill(recipe: Recipe, *, write: bool = True) -> None:
    """Make `train.init` and a local `distill.teacher` absolute, and refuse a teacher whose tokenizer is not the
    student's and the data's (`zebra.train.distill_teacher.check_teacher`) or distill keys that do not go together;
    `write` False (a dry run): a new logit cache's folder is not made."""
    t, d = recipe.train, recipe.distill
    if t.init:
        init = Path(t.init).expanduser()
        if not (init / "config.json").is_file():
            raise ZebraError(
                f"train.init {t.init}: no config.json there",
                fix="pass --init with an export folder (zebra upcycle's output, or a run's export/)",
            )
        t.init = str(init.resolve())
        _check_init_tokenizer(recipe)
    if d.teacher:
        from zebra.train.distill_teacher import check_teacher
        from zebra.upcycle.teachers.teacher import resolve_teacher_spec

        d.teacher = resolve_teacher_spec(d.teacher)
        check_teacher(recipe)
        check_distill_options(recipe, write=write)


def check_distill_options(recipe: Recipe, *, write: bool = True) -> None:
    """One line for distill keys that cannot work together, or need a `train.init` with upcycle.json."""
    from zebra.train.param_roles import needs_roles, new_mixer_sublayers

    d = recipe.distill
    if d.top_k and d.temperature != 1.0:
        raise ZebraError(
            f"distill.top_k {d.top_k} with distill.temperature {d.temperature}: the top-k KL is taken at "
            "temperature 1 (the rest of the teacher's mass is known only there)",
            fix="--set distill.temperature=1, or distill.top_k=0 for the KL over the whole vocabulary",
        )
    if d.top_k > recipe.model.vocab_size:
        raise ZebraError(
            f"distill.top_k {d.top_k} is above model.vocab_size {recipe.model.vocab_size}",
            fix=f"--set distill.top_k={min(64, recipe.model.vocab_size)}",
        )
    if d.logit_cache and not (d.top_k and d.stage == "kd"):
        raise ZebraError(
            "distill.logit_cache keeps the teacher's top-k logits of KD: it needs distill.top_k > 0 and "
            "distill.stage kd",
            fix="--set distill.top_k=64 (for example), or distill.logit_cache=''",
        )
    if needs_roles(recipe):
        new_mixer_sublayers(recipe.train.init)
    if d.logit_cache:
        from zebra.train.logit_cache import open_manifest

        d.logit_cache = str(open_manifest(recipe, create=write))


def _check_init_tokenizer(recipe: Recipe) -> None:
    """Refuse a data.tokenizer whose vocabulary differs from the `train.init` export's tokenizer: the student's
    embeddings belong to the export's ids, and the run's export would ship data.tokenizer beside them."""
    from zebra.data.tokenizers import export_vocabulary, vocabulary

    init = Path(recipe.train.init)
    theirs = export_vocabulary(init)
    if theirs is None:
        return
    ours = vocabulary(load_tokenizer(recipe.data.tokenizer))
    if ours != theirs:
        raise ZebraError(
            f"train.init {init}: its tokenizer ({theirs[0]} ids, vocabulary {theirs[1][:12]}) differs from "
            f"data.tokenizer {recipe.data.tokenizer} ({ours[0]} ids, vocabulary {ours[1][:12]})",
            fix=f"--set data.tokenizer={init} and data prepared with it (zebra data prep --tokenizer {init})",
        )


def distill_overrides(teacher: str | None, init: str | None) -> dict[str, Any]:
    """Typed recipe overrides for `zebra train --teacher / --init` (init also sets the export's model shapes)."""
    from zebra.train.init_weights import init_overrides

    sets = init_overrides(init) if init else {}
    if teacher:
        sets["distill.teacher"] = teacher
    return sets


def _check_vocab(recipe: Recipe) -> None:
    vocab = len(load_tokenizer(recipe.data.tokenizer))
    if vocab > recipe.model.vocab_size:
        raise ZebraError(
            f"data.tokenizer {recipe.data.tokenizer} has {vocab} ids but model.vocab_size is "
            f"{recipe.model.vocab_size}",
            fix=f"--set model.vocab_size={vocab} (or larger), or use the recipe's tokenizer",
        )


def _check_manifest_tokenizer(path: DataPath, recipe: Recipe) -> None:
    """Data prepared with another tokenizer than the recipe's would train on meaningless ids: refuse it. The same
    tokenizer under another name (a moved or copied folder, an absolute path) has the same vocabulary hash."""
    folder = prep_folder(path.target)
    if folder is None:
        return
    record = read_manifest(folder).tokenizer
    name = record.get("name")
    if name and name != recipe.data.tokenizer and not _same_vocabulary(record, recipe.data.tokenizer):
        raise ZebraError(
            f"--data {path}: tokenized with {name}, but the recipe trains with {recipe.data.tokenizer}",
            fix=f"--set data.tokenizer={name} (with a model.vocab_size that covers it), or prepare the data "
            f"again with --tokenizer {recipe.data.tokenizer}",
        )


def _same_vocabulary(record: dict[str, Any], tokenizer: str) -> bool:
    """Whether `tokenizer` has the vocabulary a manifest's tokenizer record names (size and hash)."""
    from zebra.data.tokenizers import recorded_vocabulary, vocabulary

    recorded = recorded_vocabulary(record)
    return recorded is not None and vocabulary(load_tokenizer(tokenizer)) == recorded


def run_name(run: str | None, recipe: Recipe) -> str:
    """The run's folder name under --output: `--run`, else the recipe's `name:`; one path component, so that
    the run (and what `--resume never` deletes) stays inside --output; printable text, so that the folder's name
    is what every message shows (a byte that is not UTF-8 arrives as a lone surrogate, which is not printable)."""
    name = run or recipe.name
    if name in ("", ".", "..") or "/" in name or "\\" in name or not name.isprintable():
        origin = "--set" if "name" in recipe.overridden else recipe.source or "recipe"
        where = f"--run {name!r}" if run else f"{origin}: name: {name!r}"
        raise ZebraError(
            f"{where}: a run name is one folder name (no '/', not '.' or '..', no control character, UTF-8 text)",
            fix="pass --run NAME with a plain name (--output DIR chooses the folder that holds the runs)",
        )
    return name


def resolve_run(
    recipe: Recipe,
    ranks: RankLayout,
    *,
    output: str | Path = "runs",
    run: str | None = None,
    resume: str = "auto",
    prepare_data: bool = True,
) -> TrainRun:
    """Resolve and check everything a run of `recipe` on `ranks` needs (a one-line ZebraError for any problem).

    The run keeps a copy of `recipe` with its data resolved; `recipe` itself is left as it was. `prepare_data`
    False (a dry run) writes nothing: `@sample` not tokenized yet is named by the prefix it will have
    (`resolve_data`).
    """
    recipe = copy.deepcopy(recipe)
    t = recipe.train
    micro, accumulation = batch_plan(t.global_batch_size, t.micro_batch_size, ranks.world_size)
    if resume not in ("auto", "never"):
        if not Path(resume).exists():
            raise ZebraError(
                f"--resume {resume}: no such checkpoint", fix="pass auto, never or an existing path"
            )
        resume = str(Path(resume).resolve())  # ranks may start elsewhere: a container, a Slurm task's folder
    if t.optimizer_graph:
        check_optimizer_graph(ranks.device)
    if recipe.model.kernel_backend in ("fla", "mamba_ssm") and ranks.device != "cuda":
        raise ZebraError(
            f"model.kernel_backend={recipe.model.kernel_backend} needs a CUDA/ROCm GPU (this run is on {ranks.device})",
            fix="--set model.kernel_backend=auto (FLA's kernels on a GPU, the torch reference elsewhere)",
        )
    run_dir = Path(output) / run_name(run, recipe)
    resolve_data(recipe, prepare_data=prepare_data)
    resolve_distill(recipe, write=prepare_data)
    found = committed(run_dir / "checkpoints")
    resolved = TrainRun(
        recipe=recipe,
        run_dir=run_dir,
        ranks=ranks,
        micro_batch=micro,
        accumulation=accumulation,
        resume=resume,
        checkpoint_step=newest_step(found),
    )
    saved = run_dir / "config.yaml"
    if saved.is_file() and resume == "auto" and found:
        resolved.changed = _changed_keys(saved, dump_recipe(recipe))
        _check_same_model(saved, recipe, resolved.changed)
    if resume == "auto" and (resolved.checkpoint_step or 0) > t.max_steps:
        raise ZebraError(
            f"{run_dir}: already at step {resolved.checkpoint_step}, past train.max_steps {t.max_steps}",
            fix=f"pass --max-steps above {resolved.checkpoint_step} to train it further, or --run NAME for a new run",
        )
    return resolved


def _check_same_model(saved: Path, recipe: Recipe, changed: list[str]) -> None:
    """Resuming loads the run's checkpoints into the recipe's model: refuse, before anything is written, a recipe
    whose layer pattern or parameter counts differ from those of the run's config.yaml (so its checkpoints)."""
    try:
        before = load_recipe(saved)
    # a config.yaml of another zebra version, or edited by hand: loading a checkpoint decides
    except ZebraError:
        return

    def shape(r: Recipe) -> tuple:
        config = arch.as_config(r.model.flat())
        return arch.resolve_pattern(config), arch.param_count(config)

    if shape(before) == shape(recipe):
        return
    keys = [k for k in changed if k.startswith("model.")]
    run_dir = saved.parent
    raise ZebraError(
        f"{run_dir}: its checkpoints hold another model than this recipe's ({', '.join(keys[:6])} differ from "
        f"its config.yaml)",
        fix=f"pass --run NAME for a new run, --resume never --yes to start {run_dir.name} over, or train with "
        "the run's model settings",
    )


def _changed_keys(saved: Path, new_yaml: str) -> list[str]:
    import yaml

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(d, dict):
            return {prefix: d}
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out

    fix = "restore it, or remove it (the run writes it again from the recipe; its checkpoints keep the model)"
    with reading(saved, what="the run's recipe as YAML", fix=fix, also=(yaml.YAMLError,)):
        old = flat(yaml.safe_load(saved.read_text(encoding="utf-8")) or {})
    new = flat(yaml.safe_load(new_yaml))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def has_outputs(run_dir: Path) -> bool:
    """True when `run_dir` holds results of an earlier run (checkpoints, metrics, export)."""
    return any((run_dir / name).exists() for name in RUN_OUTPUTS)


def results_without_checkpoint(run: TrainRun) -> list[str]:
    """The results of an earlier run (metrics.jsonl, export/, loss.png, tensorboard/) that `run` would start
    over on because it has no checkpoint to resume (`--resume auto`, checkpoints/ gone or never written): a run
    that starts replaces them, so it asks first, as `--resume never` does."""
    if run.resume != "auto" or run.checkpoint_step is not None:
        return []
    return [
        name
        for name in RUN_OUTPUTS
        if name not in ("checkpoints", "data_cache") and (run.run_dir / name).exists()
    ]


def replaces_outputs(run: TrainRun) -> bool:
    """True when `--resume PATH` continues from another checkpoint than the newest of a run directory that holds
    outputs: as the steps come round again, its metrics.jsonl is cut and its checkpoints are replaced."""
    if run.resume in ("auto", "never") or not has_outputs(run.run_dir):
        return False
    start = find_checkpoints(run.resume, run.run_dir)[:1]
    newest = committed(run.run_dir / "checkpoints")[:1]
    return [p.resolve() for p in start] != [p.resolve() for p in newest]


def run_lock(run_dir: str | Path) -> FolderLock:
    """The lock of a run directory (`RUN/.lock`), held by whoever trains into it: the `zebra train` process
    for local and Docker runs, task 0 of the job for Slurm runs. Not yet taken: `acquire()` or `with`."""
    return FolderLock(
        run_dir, fix="wait for that run to end (or stop it), or pass --run NAME for another run"
    )


def prepare_run(run: TrainRun, *, start_over: bool = False) -> Path:
    """Create the run directory and write the resolved recipe to `config.yaml` (atomically).

    Args:
        start_over: delete an earlier run's checkpoints, metrics and export first (`--resume never`).
    """
    if start_over:
        # the checkpoints first: one being read refuses, and nothing is deleted
        remove_checkpoints(run.run_dir / "checkpoints")
        for name in RUN_OUTPUTS:
            target = run.run_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run.run_dir / "config.yaml", dump_recipe(run.recipe))
    return run.run_dir
