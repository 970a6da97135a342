"""`zebra distill`: a distilled hybrid from a teacher and text in one command, the published pipeline's stages in
one folder (docs/upcycle.md "One command").

    OUT/stages.json     the options and every stage's state and result, its wall seconds over all calls
                        (rewritten whole, atomically)
    OUT/upcycle-mla/    the all-MLA student (`zebra upcycle --mla-layers all --calibrate DATA`): an export with upcycle.json
    OUT/upcycle-rec/    the all-recurrent student (`--mla 0 --calibrate DATA`)
    OUT/ild-mla/        ILD of the all-MLA student (a training run; its export/)       ild_fraction / 2 of --tokens
    OUT/ild-rec/        ILD of the all-recurrent student                               ild_fraction / 2
                        (no ILD stages with --ild-fraction 0: the upcycled students are composed)
                        (--upcycled-from DIR: both taken from DIR, another pipeline upcycled alike)
    OUT/hybrid/         the two composed, MLA layers placed by SMART (`zebra upcycle --compose`)
    OUT/kd/             end-to-end KD of the hybrid; OUT/kd/export is the result       the rest of --tokens
    OUT/loss.png        held-out CE against tokens over the training stages, the teacher's as a line

The stage list is data (`plan_stages`): each `Stage` names its runner (`RUNNERS`) and what it passes on, so a
stage is one entry. Both upcycle stages calibrate their student on --data (`zebra.upcycle.calibrate`: each new
mixer fitted to its teacher layer's attention, teacher-forced by default: the students are composed, and a fit on
one student's own stream corrects a drift the hybrid does not have) unless `calibrate` is off. Every
check that can fail runs before the first stage (`check_options`). A second call with the same options continues:
finished stages are skipped, a training stage resumes from its newest checkpoint (the trainer's; SIGTERM saves
one, kill -9 loses the steps since the last), an interrupted upcycle or compose is redone.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zebra.core.atomic import make_folder, write_atomic
from zebra.core.errors import ZebraError
from zebra.train.view import TrainView

STATE_FILE = "stages.json"
Progress = Callable[..., None]  # (done, total, note)
MIN_STEPS = 2  # optimizer steps a training stage needs at the least (one to warm up, one to decay)


@dataclass(frozen=True)
class PipelineOptions:
    """What `zebra distill` was asked for (recorded in stages.json; a resume must ask the same)."""

    teacher: str
    data: str  # a prepared folder or Megatron prefix in the teacher's tokenizer
    tokens: int  # training tokens over all stages
    output: str
    mixer: str = "mamba"
    mla: int = 8
    placement: str = "smart"
    seq_len: int = 2048
    batch: int = 8  # sequences per optimizer step
    micro_batch: int = 8
    # no ILD: after calibration it measured worse (docs/upcycle.md); 0.2 is the published share
    ild_fraction: float = 0.0
    ild_lr: float = 5e-4
    kd_lr: float = 3e-4  # keeps the calibrated start (1e-3 undoes it first: docs/benchmarks.md)
    evals: int = 4  # held-out evaluations (and checkpoints) per training stage
    smart_samples: int = 64
    device: str = "auto"
    sets: tuple[str, ...] = ()  # recipe overrides for every training stage
    calibrate: bool = True  # fit each upcycled student's mixers to the teacher's attention on `data` first
    # the calibration's size (zebra upcycle --calibrate-samples, -seq-len, -steps, -batch); None: the default on
    # `device` (zebra.upcycle.calibrate.default_size: larger on a GPU)
    calibrate_samples: int | None = None  # calibration sequences
    calibrate_seq_len: int | None = None  # tokens per calibration sequence
    calibrate_steps: int | None = None  # fit steps per mixer layer
    calibrate_batch: int | None = None  # sequences per fit step
    calibrate_lr: float = 1e-3  # the rest as `zebra upcycle --calibrate-*` (zebra.upcycle.calibrate.SETTINGS)
    calibrate_schedule: str = "constant"
    calibrate_teacher_forced: bool = True  # each mixer on the teacher's input: it composes (docs/upcycle.md)
    calibrate_correct_residual: float = 1.0
    calibrate_output_lstsq: bool = False
    calibrate_pass_through: bool = True
    calibrate_workers: int = 0  # processes fitting the layers at once (0: one per GPU of `cuda`, else 1)
    upcycled_from: str | None = None  # another pipeline's folder: its upcycle stages taken instead of redone

    def calibration(self) -> Any:
        """The `CalibrateOptions` of both upcycle stages (None with `calibrate` off); checks every setting."""
        from zebra.upcycle.calibrate import CalibrateOptions, sized
        from zebra.upcycle.fit import FitOptions

        if not self.calibrate:
            return None
        size = sized({"samples": self.calibrate_samples, "seq_len": self.calibrate_seq_len,
                      "steps": self.calibrate_steps, "batch": self.calibrate_batch}, self.device)  # fmt: skip
        fit = FitOptions(steps=size["steps"], lr=self.calibrate_lr, batch=size["batch"],
                         schedule=self.calibrate_schedule, output_lstsq=self.calibrate_output_lstsq,
                         pass_through=self.calibrate_pass_through)  # fmt: skip
        return CalibrateOptions(self.data, size["samples"], size["seq_len"], self.device, fit,
                                sequential=not self.calibrate_teacher_forced,
                                correct_residual=self.calibrate_correct_residual,
                                workers=self.calibrate_workers)  # fmt: skip


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: `kind` picks its runner (`RUNNERS`), `share` its part of --tokens."""

    name: str
    kind: str  # upcycle | train | compose
    share: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)


def plan_stages(o: PipelineOptions) -> list[Stage]:
    """The published pipeline: two students, ILD of each, SMART composition, KD (arXiv 2505.17272). With
    --ild-fraction 0 there is no ILD: the upcycled (calibrated) students are composed as they are."""
    half, ild = o.ild_fraction / 2, o.ild_fraction > 0
    students = [
        Stage("ild-mla", "train", half, {"init": "upcycle-mla", "stage": "ild", "lr": o.ild_lr}),
        Stage("ild-rec", "train", half, {"init": "upcycle-rec", "stage": "ild", "lr": o.ild_lr}),
    ] if ild else []  # fmt: skip
    mla, recurrent = ("ild-mla", "ild-rec") if ild else ("upcycle-mla", "upcycle-rec")
    return [
        Stage("upcycle-mla", "upcycle", params={"student": {"mla_layers": "all"}}),
        Stage("upcycle-rec", "upcycle", params={"student": {"mla": 0}}),
        *students,
        Stage("hybrid", "compose", params={"mla": mla, "recurrent": recurrent}),
        Stage("kd", "train", 1.0 - o.ild_fraction, {"init": "hybrid", "stage": "kd", "lr": o.kd_lr}),
    ]


def stage_steps(o: PipelineOptions, stage: Stage) -> int:
    """Optimizer steps of a training stage: its share of --tokens in steps of batch x seq_len tokens."""
    return int(o.tokens * stage.share) // (o.batch * o.seq_len)


def export_of(o: PipelineOptions, name: str) -> Path:
    """The export folder stage `name` leaves (a training stage: its run's export/)."""
    stage = next(s for s in plan_stages(o) if s.name == name)
    folder = Path(o.output) / name
    return folder / "export" if stage.kind == "train" else folder


class PipelineView:
    """What the pipeline tells while it runs; this class shows nothing (the CLI's subclass renders it)."""

    def stage_started(self, index: int, total: int, stage: Stage, steps: int) -> None:
        """Stage `index` (1-based) of `total` starts; `steps` optimizer steps for a training stage, else 0."""

    def stage_skipped(self, stage: Stage, result: dict[str, Any]) -> None:
        """A stage finished by an earlier call."""

    def stage_done(self, stage: Stage, result: dict[str, Any]) -> None:
        """A stage finished now, with its result (as in stages.json)."""

    def stage_progress(self, stage: Stage) -> contextlib.AbstractContextManager[Progress]:
        """A context giving the callback `(done, total, note)` of an upcycle stage's calibration (fit steps)."""
        return contextlib.nullcontext(lambda done, total=None, note="": None)

    def train_view(self, stage: Stage, tokens_before: int) -> TrainView:
        """The trainer's view of a training stage that starts `tokens_before` pipeline tokens in."""
        return TrainView()


def calibration_fields(calibration: Any) -> dict[str, Any]:
    """The `calibrate_*` fields of `PipelineOptions` holding a `CalibrateOptions` (None: their defaults)."""
    if calibration is None:
        return {}
    f = calibration.fit
    return {"calibrate_samples": calibration.samples, "calibrate_seq_len": calibration.seq_len,
            "calibrate_steps": f.steps, "calibrate_batch": f.batch, "calibrate_lr": f.lr,
            "calibrate_schedule": f.schedule, "calibrate_teacher_forced": not calibration.sequential,
            "calibrate_correct_residual": calibration.correct_residual, "calibrate_output_lstsq": f.output_lstsq,
            "calibrate_pass_through": f.pass_through, "calibrate_workers": calibration.workers}  # fmt: skip


# options that change how a stage runs, not what it gives: a run may be continued, or taken from, with others
HOW_IT_RUNS = ("calibrate_workers",)


def options_defaults() -> dict[str, Any]:
    """The default of every `PipelineOptions` field that has one."""
    import dataclasses

    return {
        f.name: f.default for f in dataclasses.fields(PipelineOptions) if f.default is not dataclasses.MISSING
    }


class PipelineState:
    """stages.json: the options, and per stage its status (running / stopped / done) and result."""

    def __init__(self, o: PipelineOptions):
        self.path = Path(o.output) / STATE_FILE
        options = json.loads(json.dumps(asdict(o)))  # tuples as lists, as read back
        self.data: dict[str, Any] = {"options": options, "stages": {}}
        if self.path.is_file():
            found = json.loads(self.path.read_text())
            was = {**options_defaults(), **found.get("options", {})}  # options added since: their defaults
            differ = [k for k in options if k not in HOW_IT_RUNS and was.get(k) != options[k]]
            if differ:
                raise ZebraError(
                    f"{o.output}: a pipeline started with other options ({', '.join(differ)} differ from its "
                    f"{STATE_FILE})",
                    fix="pass the options it was started with to continue it, or another --output",
                )
            self.data = found

    def status(self, name: str) -> str | None:
        return self.data["stages"].get(name, {}).get("status")

    def result(self, name: str) -> dict[str, Any]:
        return self.data["stages"].get(name, {}).get("result", {})

    def set(self, name: str, status: str, result: dict[str, Any] | None = None) -> None:
        entry = self.data["stages"].setdefault(name, {})
        entry.update(status=status, updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        if result is not None:
            entry["result"] = result
        write_atomic(self.path, json.dumps(self.data, indent=2) + "\n")


@dataclass
class PipelineResult:
    output: Path
    stopped_by: str | None  # the signal that stopped a training stage, None when every stage is done
    stages: dict[str, dict[str, Any]]  # stage name -> its result
    student: Path | None  # the distilled export, once the last stage is done


def run_pipeline(o: PipelineOptions, view: PipelineView | None = None) -> PipelineResult:
    """Every stage of `plan_stages(o)` not done yet, in order, recorded in stages.json; stops (returning the
    signal) when a training stage was stopped. Raises ZebraError before any work for bad options."""
    from zebra.train.plot import plot_pipeline

    view = view or PipelineView()
    check_options(o)
    make_folder(Path(o.output))
    state = PipelineState(o)
    stages = plan_stages(o)
    tokens_before = 0
    for index, stage in enumerate(stages, 1):
        steps = stage_steps(o, stage) if stage.kind == "train" else 0
        if state.status(stage.name) == "done":
            view.stage_skipped(stage, state.result(stage.name))
        else:
            view.stage_started(index, len(stages), stage, steps)
            state.set(stage.name, "running")
            start = time.monotonic()
            result = RUNNERS[stage.kind](o, stage, view, tokens_before)
            # wall seconds of the stage over every call that ran it (a resumed stage adds to its earlier calls')
            result["seconds"] = state.result(stage.name).get("seconds", 0.0) + time.monotonic() - start
            stopped = result.pop("stopped_by", None)
            state.set(stage.name, "stopped" if stopped else "done", result)
            if stopped:
                return PipelineResult(Path(o.output), stopped, state.data["stages"], None)
            view.stage_done(stage, result)
        tokens_before += steps * o.batch * o.seq_len
    runs = [(s.name, Path(o.output) / s.name) for s in stages if s.kind == "train"]
    plot_pipeline(runs, o.batch * o.seq_len, Path(o.output) / "loss.png")
    return PipelineResult(Path(o.output), None, state.data["stages"], export_of(o, stages[-1].name))


def run_upcycle(o: PipelineOptions, stage: Stage, view: PipelineView, tokens_before: int) -> dict[str, Any]:
    from zebra.upcycle import StudentOptions, upcycle

    out = Path(o.output) / stage.name
    if o.upcycled_from is not None:
        return take_upcycled(o, stage, out)
    options = StudentOptions(mixer=o.mixer, **stage.params["student"])
    with view.stage_progress(stage) as on_calibrate:
        report = upcycle(o.teacher, out, options, dtype="fp32", force=True, calibrate=o.calibration(),
                         on_calibrate=on_calibrate)  # fmt: skip
    result = {"export": str(out), "pattern": report.pattern, "student_params": report.student_params}
    if report.calibration:  # each mixer's error as upcycled and after its fit
        result["calibration"] = report.calibration
    return result


def take_upcycled(o: PipelineOptions, stage: Stage, out: Path) -> dict[str, Any]:
    """Stage `stage` as --upcycled-from left it (checked alike by `check_upcycled_from`): its export hard-linked
    (copied across file systems; an export's files are only ever replaced, never written in place) under a
    temporary name, then renamed into place, and its result."""
    import os
    import shutil

    source = Path(o.upcycled_from) / stage.name
    partial = out.with_name(f".{out.name}.partial")
    for stale in (partial, out):
        shutil.rmtree(stale, ignore_errors=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, partial, copy_function=link)
    partial.rename(out)
    found = json.loads((Path(o.upcycled_from) / STATE_FILE).read_text())["stages"][stage.name]["result"]
    kept = {k: v for k, v in found.items() if k not in ("export", "seconds")}
    return {**kept, "export": str(out), "upcycled_from": str(source)}


def run_compose(o: PipelineOptions, stage: Stage, view: PipelineView, tokens_before: int) -> dict[str, Any]:
    from zebra.upcycle.compose import compose

    out = Path(o.output) / stage.name
    smart = o.placement == "smart"
    report = compose(export_of(o, stage.params["mla"]), export_of(o, stage.params["recurrent"]), out,
                     mla=o.mla, placement=o.placement, calibration=o.data if smart else None,
                     samples=o.smart_samples, seq_len=min(o.seq_len, 512), device=o.device, force=True)  # fmt: skip
    return {"export": str(out), "pattern": report.pattern, "mla_layers": list(report.mla_layers),
            "placement": report.placement, "kv_cache_fraction": report.kv_cache_fraction}  # fmt: skip


def train_overrides(o: PipelineOptions, stage: Stage, steps: int) -> dict[str, Any]:
    """The typed overrides of a training stage's recipe (`tiny`'s, its model replaced by the init export's),
    then the user's `--set`."""
    from zebra.core.device import resolve_device
    from zebra.recipes.loader import combine, parse_assignments
    from zebra.train.run import distill_overrides

    init = export_of(o, stage.params["init"])
    lr, interval = stage.params["lr"], max(1, steps // o.evals)
    cuda = resolve_device(o.device).startswith("cuda")
    stage_sets = {
        "distill.stage": stage.params["stage"],
        "data.paths": [o.data], "data.mock": False, "data.tokenizer": str(init), "data.seq_len": o.seq_len,
        "train.global_batch_size": o.batch, "train.micro_batch_size": o.micro_batch,
        "train.max_steps": steps, "train.lr": lr, "train.min_lr": lr / 10,
        "train.warmup_steps": max(1, steps // 100), "train.lr_decay_style": "cosine",
        "train.eval_interval": interval, "train.save_interval": interval, "train.export": True,
        "train.precision": "bf16" if cuda else "fp32",
    }  # fmt: skip
    return combine(distill_overrides(o.teacher, str(init)), stage_sets, parse_assignments(o.sets))


def run_train(o: PipelineOptions, stage: Stage, view: PipelineView, tokens_before: int) -> dict[str, Any]:
    """One training stage through the trainer (resumed from its newest checkpoint, if any)."""
    from zebra.core.device import resolve_device
    from zebra.recipes import load_recipe
    from zebra.train.metrics import read_metrics
    from zebra.train.run import RankLayout, prepare_run, resolve_run
    from zebra.train.trainer import train_rank

    steps = stage_steps(o, stage)
    recipe = load_recipe("tiny", overrides=train_overrides(o, stage, steps))
    recipe.name = stage.name
    device = resolve_device(o.device)
    run = resolve_run(recipe, RankLayout(device.split(":")[0], 1, 1), output=o.output, run=stage.name)
    prepare_run(run)
    result = train_rank(run.run_dir, resume="auto", device=device, view=view.train_view(stage, tokens_before))
    records = [r for r in read_metrics(run.run_dir / "metrics.jsonl") if "val_loss" in r]
    last = records[-1] if records else {}
    return {
        "run": str(run.run_dir), "export": str(run.run_dir / "export"), "steps": result.step,
        "tokens": result.step * o.batch * o.seq_len, "loss": result.loss, "heldout_ce": last.get("val_loss"),
        "teacher_heldout_ce": last.get("teacher_val_loss"), "stopped_by": result.stopped_by,
    }  # fmt: skip


RUNNERS: dict[str, Callable[[PipelineOptions, Stage, PipelineView, int], dict[str, Any]]] = {
    "upcycle": run_upcycle,
    "compose": run_compose,
    "train": run_train,
}


def check_options(o: PipelineOptions) -> None:
    """Every one-line refusal that can be known before the first stage: an output that overlaps what is read, the
    teacher, the data's tokenizer, the MLA count, the token budget."""
    from zebra.core.atomic import check_creatable, check_output_apart
    from zebra.upcycle import open_teacher
    from zebra.upcycle.student import upcycle_mixers

    # --data is a prepared folder or a Megatron prefix (its .bin beside it)
    check_output_apart(o.output, {"the teacher": o.teacher, "--data": o.data, "--data's shard": f"{o.data}.bin",
                                  "--upcycled-from": o.upcycled_from})  # fmt: skip
    check_creatable(o.output, fix="choose another --output")  # before hours of distillation
    check_settings(o)
    check_upcycled_from(o)
    mixers = upcycle_mixers()  # names and aliases (`mamba`, the default, is mamba2)
    if o.mixer not in mixers or mixers[o.mixer].state != "recurrent":
        recurrent = [n for n, m in mixers.items() if m.state == "recurrent"]
        raise ZebraError(f"--mixer {o.mixer}: unknown", fix=f"use one of {', '.join(recurrent)}")
    teacher = open_teacher(o.teacher)  # a missing or unsupported teacher: its own one-line error
    try:
        layers = teacher.shape.num_layers
        if teacher.tokenizer is None:
            raise ZebraError(f"teacher {o.teacher}: no tokenizer found beside it",
                             fix="use a teacher folder or file that carries its tokenizer")  # fmt: skip
        check_data_tokenizer(o.data, teacher.tokenizer, o.teacher)
    finally:
        teacher.tensors.close()
    if not 1 <= o.mla <= layers:
        raise ZebraError(f"--mla {o.mla}: the teacher has {layers} layers",
                         fix=f"pass --mla between 1 and {layers}")  # fmt: skip
    check_budget(o)


def upcycle_options() -> tuple[str, ...]:
    """The options the upcycle stages depend on: the teacher, the data, the mixer and every calibration setting
    (not the processes that fit it: the result does not depend on them)."""
    import dataclasses

    fields = [f.name for f in dataclasses.fields(PipelineOptions)]
    return (
        "teacher",
        "data",
        "mixer",
        *(f for f in fields if f.startswith("calibrate") and f not in HOW_IT_RUNS),
    )


def check_upcycled_from(o: PipelineOptions) -> None:
    """--upcycled-from DIR: a `zebra distill` folder whose upcycle stages are done, with the same upcycle options
    (`upcycle_options`; paths compared as resolved)."""
    if o.upcycled_from is None:
        return
    source = Path(o.upcycled_from)
    flag = f"--upcycled-from {source}"
    try:
        found = json.loads((source / STATE_FILE).read_text())
        was = {**options_defaults(), **found["options"]}
    except (OSError, ValueError, KeyError, TypeError):
        raise ZebraError(f"{flag}: no readable {STATE_FILE} there",
                         fix="pass the --output folder of an earlier zebra distill") from None  # fmt: skip

    def same(key: str) -> bool:
        mine, theirs = getattr(o, key), was.get(key)
        if key in ("teacher", "data") and isinstance(theirs, str):
            return Path(mine).resolve() == Path(theirs).resolve() or mine == theirs
        return json.loads(json.dumps(mine)) == theirs

    differ = [k for k in upcycle_options() if not same(k)]
    if differ:
        raise ZebraError(f"{flag}: upcycled with other options ({', '.join(differ)} differ)",
                         fix="pass the teacher, --data, --mixer and --calibrate-* it was run with, "
                         "or leave --upcycled-from out")  # fmt: skip
    stages = found.get("stages", {})
    for stage in plan_stages(o):
        if stage.kind == "upcycle" and (stages.get(stage.name, {}).get("status") != "done"
                                        or not (source / stage.name / "config.json").is_file()):  # fmt: skip
            raise ZebraError(
                f"{flag}: its {stage.name} stage is not done",
                fix=f"run that zebra distill until {stage.name} is done, or leave --upcycled-from out",
            )


def check_settings(o: PipelineOptions) -> None:
    """The placement, the learning rates and the calibration's settings (`PipelineOptions.calibration`)."""
    import math

    from zebra.upcycle.compose import PLACEMENTS

    if o.placement not in PLACEMENTS:
        raise ZebraError(f"--placement {o.placement}: unknown", fix=f"use one of {', '.join(PLACEMENTS)}")
    for name, lr in (("--ild-lr", o.ild_lr), ("--kd-lr", o.kd_lr)):
        if not (math.isfinite(lr) and lr > 0):
            raise ZebraError(f"{name} {lr}: out of range", fix="pass a finite learning rate > 0, e.g. 1e-3")
    o.calibration()


def check_data_tokenizer(data: str, tokenizer: Any, teacher: str) -> None:
    """Refuse data that is missing or was prepared with another tokenizer than the teacher's."""
    from zebra.data import read_manifest
    from zebra.data.paths import parse_data_path, prep_folder
    from zebra.data.tokenizers import recorded_vocabulary, vocabulary

    target = parse_data_path(data).target
    folder = prep_folder(target)
    if folder is None:
        if not Path(f"{target}.bin").is_file():
            raise ZebraError(f"--data {data}: no prepared folder or Megatron prefix there",
                             fix=f"zebra data prep --source TEXT --tokenizer {teacher} -o {data}")  # fmt: skip
        folder = prep_folder(Path(target).parent)  # a prefix inside a prepared folder
        if folder is None:
            return  # a bare prefix: the training stages check its ids against the vocabulary
    recorded = recorded_vocabulary(read_manifest(folder).tokenizer)
    want = vocabulary(tokenizer)
    if recorded is not None and recorded != want:
        raise ZebraError(
            f"--data {data}: tokenized with another tokenizer ({recorded[0]} ids, vocabulary {recorded[1][:12]}) "
            f"than the teacher's ({want[0]} ids, vocabulary {want[1][:12]})",
            fix=f"prepare it again with the teacher's tokenizer: zebra data prep --tokenizer {teacher}",
        )


def check_budget(o: PipelineOptions) -> None:
    """Every training stage gets at least `MIN_STEPS` steps of --tokens."""
    per_step = o.batch * o.seq_len
    for stage in plan_stages(o):
        if stage.kind == "train" and stage_steps(o, stage) < MIN_STEPS:
            need = -(-MIN_STEPS * per_step // stage.share) if stage.share else 0
            raise ZebraError(
                f"--tokens {o.tokens:,}: stage {stage.name} gets {stage_steps(o, stage)} steps of {o.batch} x "
                f"{o.seq_len} tokens ({stage.share:.0%} of the budget), it needs {MIN_STEPS}",
                fix=f"pass --tokens {int(need):,} or more, or a smaller --batch / --seq-len",
            )
