"""The training loop of one rank: build, restore, step, log, evaluate, checkpoint, export.

recipe (RUN/config.yaml) -> ZebraForCausalLM -> AC / compile / DDP or FSDP2 -> AdamW + schedule
(+ the frozen teacher of `distill.teacher`, sharded or replicated like the student)
-> restore latest checkpoint, else the `train.init` export's weights
-> for each step: micro-batches -> TrainStep (CE, or the distillation loss) -> log / eval / save
-> final checkpoint, HF export (RUN/export), loss curve (RUN/loss.png)
"""

from __future__ import annotations

import dataclasses
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.caches import kernel_cache_dir, use_kernel_cache
from zebra.core.errors import ZebraError, first_line
from zebra.data import load_tokenizer
from zebra.folders.checkpoint_dir import step_name
from zebra.mixers import MAMBA2
from zebra.recipes import Recipe, load_recipe
from zebra.spec import arch
from zebra.train import checkpoint as ckpt
from zebra.train.data import batch_plan, build_train_order, micro_batches
from zebra.train.dist import DistEnv, all_reduce_sum, barrier, destroy_distributed, init_distributed
from zebra.train.distill import DistillLoss, DistillWeights
from zebra.train.distill_teacher import load_teacher
from zebra.train.ild import ILDLoss
from zebra.train.init_weights import load_init
from zebra.train.metrics import (
    IntervalMeter,
    MetricsLog,
    device_peak_flops,
    mfu,
    peak_memory_gb,
    process_seconds,
)
from zebra.train.optim import build_optimizer, build_scheduler
from zebra.train.parallelize import choose_parallel, eager_float8_note, parallelize
from zebra.train.param_roles import MIXER, needs_roles, new_mixer_sublayers, role
from zebra.train.peers import watch_peers
from zebra.train.plot import plot_runs
from zebra.train.step import TrainStep, loss_sum
from zebra.train.view import TrainView

if TYPE_CHECKING:
    import torch

STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
EXIT_NONFINITE = 3  # exit code when non-finite losses stop a run


@dataclass
class Progress:
    """How far the run is: saved in every checkpoint (DCP Stateful)."""

    step: int = 0  # optimizer steps done
    consumed_samples: int = 0  # the data position: sequences read so far, over all ranks
    tokens: int = 0  # unmasked tokens trained on
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient

    def state_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for k, v in state.items():
            setattr(self, k, int(v))


class ModelState:
    """The model's weights under ZebraForCausalLM's own parameter names, whatever the wrapper."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state)


class OptimizerState:
    """AdamW moments keyed by parameter name (so checkpoints reshard between world sizes)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state)


class StopSignals:
    """SIGTERM / SIGUSR1 (Slurm pre-emption) / SIGINT ask the loop to save and stop after the current step.

    Entered once the rank has joined its peers (`train_rank`): a SIGTERM or SIGUSR1 that arrives while the model is
    built or the data opened is kept, and the loop stops (all ranks alike) after its first step, saving it. A SIGINT before the
    loop (`looping` still False) interrupts at once: there is nothing to save yet. In the loop, a second SIGINT
    more than a second after the first interrupts at once (Ctrl-C twice).
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self.looping = False
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if name == "SIGINT" and not self.looping:
            raise KeyboardInterrupt
        if name == "SIGINT" and self.received == "SIGINT" and time.monotonic() - self._first_at > 1.0:
            raise KeyboardInterrupt
        if self.received is None:
            self.received, self._first_at = name, time.monotonic()

    def __enter__(self) -> StopSignals:
        import threading

        if threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    max_steps: int
    loss: float | None  # the last logged training loss
    val_loss: float | None
    stopped_by: str | None  # the signal that stopped the run early, None when it ran to max_steps
    checkpoint: Path | None
    export_dir: Path | None


def build_model(recipe: Recipe, device: torch.device) -> torch.nn.Module:
    """A freshly initialised ZebraForCausalLM (fp32 master weights) on `device`, seeded by train.seed."""
    import torch

    from zebra.models import ZebraForCausalLM

    torch.manual_seed(recipe.train.seed)
    with torch.device(device):
        model = ZebraForCausalLM(recipe.model.to_config())
    return model.train()


@dataclass
class LoopEnd:
    """Where the training loop left off."""

    last_saved: int | None  # the step of the newest checkpoint this run wrote or resumed from
    loss: float | None = None  # the last logged training loss
    val_loss: float | None = None
    stopped_by: str | None = None  # the stop signal that ended the loop early


class Trainer:
    """One rank's share of a run described by `recipe`, writing into `run_dir`; rank 0 reports to `view`."""

    def __init__(self, recipe: Recipe, run_dir: Path, env: DistEnv, view: TrainView | None = None):
        import torch

        self.recipe, self.run_dir, self.env = recipe, run_dir, env
        self.view = view if view is not None and env.is_main else TrainView()
        t = recipe.train
        self.micro_batch, self.accumulation = batch_plan(
            t.global_batch_size, t.micro_batch_size, env.world_size
        )
        torch.manual_seed(t.seed)
        self.model_core = build_model(recipe, env.device)
        self.mixers = new_mixer_sublayers(t.init) if needs_roles(recipe) else None  # new mixers' sublayers
        if recipe.distill.teacher and recipe.distill.stage == "ild":
            freeze_for_ild(self.model_core, self.mixers if recipe.distill.ild_params == "mixers" else None)
        self.num_params = sum(p.numel() for p in self.model_core.parameters())  # tied weights once
        self.parallel = choose_parallel(t.parallel, self.num_params, env.world_size)
        if t.optimizer_graph and self.parallel == "fsdp":
            raise ZebraError(
                "train.optimizer_graph cannot replay FSDP2's sharded optimizer step (gradients move every step)",
                fix="--set train.optimizer_graph=false, or --set train.parallel=ddp",
            )
        bf16 = t.precision == "bf16"
        self.logit_cache = None  # distill.logit_cache's LogitCache, opened by `distill_loss`
        self.teacher_val_loss: float | None = None  # the teacher's validation loss, once measured
        self.model = parallelize(
            self.model_core,
            env,
            mode=self.parallel,
            bf16=bf16,
            train=t,
        )
        if note := eager_float8_note(self.model_core.config.layer_pattern, t):
            self.view.warn(note)
        self.optimizer = build_optimizer(self.model, t, env.device, self.mixers)
        self.scheduler = build_scheduler(self.optimizer, t, recipe.distill)
        self.step_fn = TrainStep(
            self.model,
            self.optimizer,
            self.scheduler,
            env,
            autocast_bf16=bf16 and self.parallel != "fsdp",
            clip_grad=t.clip_grad,
            optimizer_graph=t.optimizer_graph,
            loss_fn=self.distill_loss(),
        )
        self.progress = Progress()
        self.data_parts: list[int] = []  # the sample counts of the data order (`build_train_order`)
        self.consecutive_skips = 0  # non-finite steps in a row
        self.metrics = None  # rank 0's MetricsLog while fitting
        self.checkpointer = ckpt.Checkpointer(run_dir, keep_last=t.keep_last, env=env, warn=self.view.warn)
        cfg = arch.as_config(recipe.model.flat())
        self.flops_per_token = arch.train_flops_per_token(cfg, recipe.data.seq_len)
        self.peak_flops = device_peak_flops(env.device)

    def distill_loss(self) -> DistillLoss | ILDLoss | None:
        """The distillation loss against `distill.teacher` (loaded here): KD on the logits or, with
        `distill.stage: ild`, intermediate-layer distillation; None for plain CE."""
        d = self.recipe.distill
        if not d.teacher:
            return None
        teacher = load_teacher(d.teacher, self.env, mode=self.parallel)
        if d.stage == "ild":
            return ILDLoss(teacher, check_ild_layers(self.model_core, teacher, d.teacher), d.ild_norm)
        cache = None
        if d.logit_cache:
            from zebra.train.logit_cache import LogitCache, writer_name

            cache = LogitCache(Path(d.logit_cache), self.recipe.data.seq_len, d.top_k,
                               writer=writer_name(self.env.rank))  # fmt: skip
        self.logit_cache = cache
        weights = DistillWeights(d.kl_weight, d.ce_weight, d.temperature, d.top_k)
        return DistillLoss(teacher, weights, cache=cache)

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds (DCP Stateful objects under their top-level keys)."""
        return {
            "model": ModelState(self.model),
            "optimizer": OptimizerState(self.model, self.optimizer),
            "scheduler": self.scheduler,
            "progress": self.progress,
        }

    def save(self) -> Path:
        meta = {
            "consumed_samples": self.progress.consumed_samples,
            "data_parts": self.data_parts,
            "recipe": self.recipe.name,
            "parallel": self.parallel,
        }
        return self.checkpointer.save(self.progress.step, self.state(), meta)

    def restore(self, resume: str, warn) -> Path | None:
        """Load the checkpoint `resume` names (`auto`: this run's newest readable one; `never`: none)."""
        if resume == "never":
            return None
        found = self.checkpointer.resume(resume, self.state(), warn=warn)
        if found is None:
            return None
        self.data_parts = [int(n) for n in found[1].get("data_parts") or []]  # none before zebra kept them
        return found[0]

    def evaluate(self, valid, global_batch: int, model: torch.nn.Module | None = None) -> float:
        """Mean validation loss over `eval_steps` fixed global batches (the same ones every time), of the
        student or of `model` (the teacher: a causal LM returning `.logits`, left in eval mode)."""
        import torch

        student = model is None
        model = self.model if student else model

        t = self.recipe.train
        stop = t.eval_steps * global_batch
        batches = micro_batches(
            valid,
            start=0,
            stop=stop,
            global_batch=global_batch,
            micro_batch=self.micro_batch,
            env=self.env,
            num_workers=0,
        )
        totals = torch.zeros(2, device=self.env.device)  # [CE sum, tokens]
        model.eval()
        with torch.no_grad():
            for batch in batches:
                tokens = batch["tokens"].to(self.env.device)  # [m, T]
                mask = batch["loss_mask"].to(self.env.device)  # [m, T]
                with self.step_fn.autocast():
                    logits = model(input_ids=tokens, use_cache=False).logits  # [m, T, V]
                totals[0] += loss_sum(logits, batch["labels"].to(self.env.device), mask)
                totals[1] += mask.sum()
        if student:
            model.train()
        all_reduce_sum(totals, self.env)
        return (totals[0] / totals[1].clamp(min=1)).item()

    def fit(self, resume: str = "auto", signals: StopSignals | None = None) -> TrainResult:
        """Train to `train.max_steps` (or until a stop signal), saving, evaluating and exporting on the way.
        `signals`: the rank's StopSignals when they were entered before the trainer was built (`train_rank`)."""
        if signals is None:
            with StopSignals() as signals:
                return self.fit(resume, signals)
        t, p, view = self.recipe.train, self.progress, self.view
        restored = self.restore(resume, view.warn)
        if restored is not None:
            view.note(f"resumed from {restored} (step {p.step}, {p.consumed_samples:,} samples read)")
        elif t.init:
            load_init(self.model, self.model_core.config, t.init)
            view.note(f"weights from {t.init}")
        batches, valid = self.open_data()
        if self.env.is_main:
            self.metrics = MetricsLog(
                self.run_dir, resume_step=p.step, config=self.recipe.to_dict(), run_name=self.run_dir.name
            )
        view.note(self.describe())
        try:
            end = self.loop(batches, valid, signals, last_saved=p.step if restored is not None else None)
        finally:
            if self.metrics:
                self.metrics.close()
        if end.last_saved != p.step:
            view.note(f"saved {self.save()}")
        if self.logit_cache is not None:
            c = self.logit_cache
            view.note(
                f"logit cache {c.folder}: {c.hits:,} sequences read back, {c.misses:,} from the teacher"
            )
        export_dir = None
        if end.stopped_by is None:
            export_dir = self.finish()
        else:
            view.note(f"stopped by {end.stopped_by} at step {p.step}; continue with --resume auto")
        return TrainResult(
            run_dir=self.run_dir,
            step=p.step,
            max_steps=t.max_steps,
            loss=end.loss,
            val_loss=end.val_loss,
            stopped_by=end.stopped_by,
            checkpoint=self.run_dir / "checkpoints" / step_name(p.step),
            export_dir=export_dir,
        )

    def open_data(self):
        """(this rank's training micro-batches from the run's data position on, the validation set or None)."""
        r, t, p = self.recipe, self.recipe.train, self.progress
        G = t.global_batch_size
        stop = p.consumed_samples + (t.max_steps - p.step) * G  # (max_steps or G may differ from the start)
        train_ds, valid_ds, self.data_parts = build_train_order(
            r,
            parts=self.data_parts,
            stop=stop,
            valid_samples=t.eval_steps * G if t.eval_interval else 0,
            cache_dir=self.run_dir / "data_cache",
        )
        batches = micro_batches(
            train_ds,
            start=p.consumed_samples,
            stop=stop,
            global_batch=G,
            micro_batch=self.micro_batch,
            env=self.env,
            num_workers=r.data.num_workers,
        )
        return batches, valid_ds

    def loop(self, batches, valid, signals: StopSignals, *, last_saved: int | None) -> LoopEnd:
        """Optimizer steps until `train.max_steps` or a stop signal all ranks agree on.

        A step's figures are read once the next step is queued (`StepResult`: on a GPU the host then never waits
        for the queue to run dry); the first step and those that log, evaluate, save or end the run are read at
        once. A stop signal is thus acted on one step later, by every rank alike.
        """
        t, p, view = self.recipe.train, self.progress, self.view
        end, meter = LoopEnd(last_saved), IntervalMeter()
        unread = None  # (step, result, lr) of the last step, read after the next one is queued
        first_step = True
        view.begin(step=p.step, total=t.max_steps)
        signals.looping = True
        try:
            while p.step < t.max_steps:
                lr = self.scheduler.get_last_lr()[0]
                res = self.step_fn(
                    [next(batches) for _ in range(self.accumulation)],
                    flags=(1.0 if signals.received else 0.0,),
                )
                p.step += 1
                p.consumed_samples += t.global_batch_size
                p.tokens += res.tokens
                stop = unread is not None and self.read(*unread, meter, end)
                unread = (p.step, res, lr)
                last = p.step == t.max_steps
                evaluate = valid is not None and t.eval_interval and (p.step % t.eval_interval == 0 or last)
                save = t.save_interval and p.step % t.save_interval == 0 and not last
                if stop or first_step or p.step % t.log_interval == 0 or last or evaluate or save:
                    stop = self.read(*unread, meter, end) or stop
                    unread = None
                if first_step:
                    self.first_step_done()
                    first_step = False
                if evaluate:
                    with meter.paused():
                        end.val_loss = self.validate(valid)
                if stop:
                    end.stopped_by = signals.received or "signal"
                    break
                if save:
                    with meter.paused():
                        view.note(f"saved {self.save()}")
                    end.last_saved = p.step
        finally:
            view.end()
        return end

    def first_step_done(self) -> None:
        """Record and show how long this process took to finish its first step (warm starts)."""
        seconds = process_seconds()
        if seconds is not None:
            self.record({"step": self.progress.step, "time_to_first_step_s": seconds})
            self.view.note(
                f"first step done {seconds:.1f} s after start (kernel cache {kernel_cache_dir()}: a second "
                "run on this machine skips compiling and autotuning)"
            )

    def validate(self, valid) -> float:
        """Evaluate, record and show the validation loss at this step; a distillation run also the teacher's on
        the same batches (`teacher_val_loss`, computed once: the teacher is frozen)."""
        G = self.recipe.train.global_batch_size
        val_loss = self.evaluate(valid, G)
        record = {"step": self.progress.step, "val_loss": val_loss}
        teacher = getattr(self.step_fn.loss_fn, "teacher", None)
        if teacher is not None and self.teacher_val_loss is None:
            self.teacher_val_loss = self.evaluate(valid, G, model=teacher)
        if self.teacher_val_loss is not None:
            record["teacher_val_loss"] = self.teacher_val_loss
        self.record(record)
        teacher_note = f" (teacher {self.teacher_val_loss:.4f})" if self.teacher_val_loss is not None else ""
        self.view.note(f"step {self.progress.step}: validation loss {val_loss:.4f}{teacher_note}")
        self.view.validated(self.progress.step, val_loss, self.teacher_val_loss)
        return val_loss

    def read(self, step: int, res, lr: float, meter, end: LoopEnd) -> bool:
        """Take in finished step `step`'s figures: a non-finite one was skipped, or stops the run
        (`train.nonfinite`); a logging step is logged (into `end.loss`). Returns whether a rank asked to stop."""
        t, p = self.recipe.train, self.progress
        if res.applied:
            self.consecutive_skips = 0
        else:
            p.skipped_steps += 1
            self.consecutive_skips += 1
            problem = (
                f"non-finite loss or gradient at step {step} (loss {res.loss}, grad norm {res.grad_norm})"
            )
            if t.nonfinite == "stop" or self.consecutive_skips > t.max_nonfinite_skips:
                why = "" if t.nonfinite == "stop" else f" ({self.consecutive_skips} steps in a row)"
                raise ZebraError(
                    problem + why,
                    fix="lower train.lr or raise train.warmup_steps, then continue from the last good checkpoint "
                    "with --resume auto",
                    exit_code=EXIT_NONFINITE,
                )
            self.view.warn(problem + ": step skipped")
        meter.add(res.loss, res.tokens, res.applied, res.metrics)
        if step % t.log_interval == 0 or step == t.max_steps:
            end.loss = self.log(meter, res, lr)
        return res.flags[0] > 0

    def log(self, meter, res, lr: float) -> float:
        """Write and show the training record of the interval that ends now; returns its mean loss."""
        parts = meter.metrics()  # distillation: kl, ce (the student's), teacher_ce
        loss, tok_s, elapsed = meter.read()
        record = {
            "step": self.progress.step,
            "loss": loss,
            "lr": lr,
            "grad_norm": res.grad_norm,
            "tokens_per_s": tok_s,
            "mfu": mfu(self.flops_per_token, tok_s, self.env.world_size, self.peak_flops),
            "memory_gb": peak_memory_gb(self.env.device),
            "tokens": self.progress.tokens,
            "skipped_steps": self.progress.skipped_steps,
            "elapsed_s": elapsed,
            **parts,
        }
        self.record(record)
        self.view.log(record)
        return loss

    def record(self, record: dict[str, Any]) -> None:
        if self.metrics:
            self.metrics.write(record)

    def finish(self) -> Path | None:
        """The end of a completed run: HF export (unless `train.export: false`) and the loss curve."""
        export_dir = None
        if self.recipe.train.export:
            export_dir = self.export(self.view.warn)
            self.view.note(f"exported {export_dir}")
        if self.env.is_main:
            png = plot_runs([self.run_dir], self.run_dir / "loss.png")
            self.view.note(f"loss curve {png}")
        barrier(self.env)
        return export_dir

    def export(self, warn) -> Path:
        """Write `<run>/export` (HF layout) from the final weights; collective (FSDP gathers the full weights).

        bf16 runs export bf16 weights, fp32 runs fp32. Without a loadable tokenizer (mock data offline)
        the export has no tokenizer files.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from zebra.convert.hf_export import export_hf  # torch

        full = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        out_dir = self.run_dir / "export"
        if self.env.is_main:
            try:
                tokenizer = load_tokenizer(self.recipe.data.tokenizer)
            except ZebraError as e:
                warn(f"export without tokenizer files: {e.message}")
                tokenizer = "none"
            export_hf(
                full,
                self.recipe,
                out_dir,
                tokenizer=tokenizer,
                dtype="bf16" if self.recipe.train.precision == "bf16" else "auto",
                force=True,
                source=f"zebra train {self.run_dir.name}, step {self.progress.step}",
                add_files=self.carry_provenance,
            )
        barrier(self.env)
        return out_dir

    def carry_provenance(self, folder: Path) -> None:
        """Copy the `train.init` export's upcycle.json into the export: it still names the teacher the weights
        came from (`zebra upcycle --compose` checks that two students share it)."""
        import shutil

        init = Path(self.recipe.train.init) / "upcycle.json" if self.recipe.train.init else None
        if init is not None and init.is_file():
            shutil.copyfile(init, folder / "upcycle.json")

    def describe(self) -> str:
        """One line saying what is trained where."""
        r, t, env = self.recipe, self.recipe.train, self.env
        dev = env.device.type if env.device.type == "cpu" else f"{env.world_size} x {env.device.type}"
        stage = "layer by layer (ILD)" if r.distill.stage == "ild" else "distilled"
        teacher = f", {stage} from {r.distill.teacher}" if r.distill.teacher else ""
        return (
            f"{r.name}: {self.num_params / 1e6:.2f}M parameters, {env.world_size} rank(s) on {dev} "
            f"({self.parallel}), {self.micro_batch} x {env.world_size} x {self.accumulation} = "
            f"{t.global_batch_size} sequences x {r.data.seq_len} tokens per step, {t.max_steps} steps{teacher}, "
            f"kernels {kernels_in_use(self.model_core.config, env.device)}"
        )


def kernels_in_use(config, device: torch.device) -> str:
    """The kernel backend the model's sublayers run on `device` ("torch", "fla"), and the Mamba2 scan's where it
    differs (auto runs it on mamba-ssm's kernels when they import). A ZebraError when a forced backend cannot run
    here (FLA or mamba-ssm missing), before the first step instead of inside it."""
    from zebra_kernels.backend import resolve_backend, resolve_ssd_backend

    try:
        chosen = resolve_backend(config.kernel_backend, device)
        mamba2 = MAMBA2 in arch.used_mixers(config.layer_pattern)
        scan = resolve_ssd_backend(config.kernel_backend, device, "chunk") if mamba2 else chosen
    except ValueError as error:
        raise ZebraError(
            f"model.kernel_backend={config.kernel_backend}: {first_line(error)}",
            fix="--set model.kernel_backend=auto (FLA's kernels where they run, else the torch reference)",
        ) from None
    return chosen if scan == chosen else f"{chosen} (Mamba2 scan: {scan})"


def freeze_for_ild(model: torch.nn.Module, mixers: frozenset[int] | None = None) -> None:
    """ILD never embeds or predicts a token (every layer is fed the teacher's states), so the embeddings and the
    head get no gradient; frozen, DDP does not wait for them and AdamW's weight decay leaves them alone.
    With `mixers` (`distill.ild_params: mixers`) only those sublayers' mixers train: MLPs and norms freeze too."""
    model.model.embeddings.requires_grad_(False)
    model.lm_head.requires_grad_(False)
    if mixers is not None:
        for name, param in model.named_parameters():
            param.requires_grad_(role(name, mixers) == MIXER)


def check_ild_layers(student: torch.nn.Module, teacher: torch.nn.Module, spec: str) -> int:
    """The teacher's layer count, once the student is shown to be one mixer/MLP pair per teacher layer."""
    from zebra.mixers import MLP

    pattern = student.config.layer_pattern
    layers = len(teacher.model.layers)
    if len(pattern) != 2 * layers or set(pattern[1::2]) != {MLP}:
        raise ZebraError(
            f"distill.stage ild: the student's pattern {pattern} is not one mixer/MLP pair per layer of "
            f"distill.teacher {spec} ({layers} layers)",
            fix="ILD-train a student made by `zebra upcycle TEACHER` (pass it with --init)",
        )
    return layers


def train_rank(
    run_dir: Path, *, resume: str = "auto", device: str = "auto", view: TrainView | None = None
) -> TrainResult:
    """Everything one rank does for the run in `run_dir` (its `config.yaml` is the resolved recipe); rank 0
    reports to `view`."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ZebraError(f"{config}: not found", fix="start runs with `zebra train RECIPE`, which writes it")
    recipe = load_recipe(config)
    use_kernel_cache()
    # waiting for peers here, a SIGTERM still ends the rank at once (nothing to save yet)
    env = init_distributed(device)
    try:
        # from here on a SIGTERM stops the run at a step it saves, even while the model is built (StopSignals);
        # a peer gone: one line naming its node (watch_peers)
        with StopSignals() as signals, watch_peers(env, run_dir):
            return Trainer(recipe, run_dir, env, view).fit(resume, signals)
    finally:
        destroy_distributed()
