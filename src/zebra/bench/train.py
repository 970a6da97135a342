"""`zebra bench train`: training throughput of a recipe with the trainer's own step, optionally next to FLA.

What is measured: `warmup` untimed then `steps` timed optimizer steps of one micro-batch each (B random token
sequences of T + 1 tokens, no accumulation), through `zebra.train.step.TrainStep` exactly as the trainer runs
it: the recipe's precision (bf16 autocast, fp32 master weights), AdamW with the trainer's parameter groups
(fused on GPU), gradient clipping, activation checkpointing / torch.compile when the recipe switches them on.
- tokens/s = B * T * steps / seconds (the device synchronises every step, as in training);
- MFU = train_flops_per_token x tokens/s / peak dense bf16 FLOP/s of the device, train_flops_per_token =
  6 N + causal MLA attention (`zebra.spec.arch.train_flops_per_token`, the same count for both models);
- MFU against the measured peak too: the bf16 matmul rate of the device measured in the run (an 8192^3 GEMM,
  `measured_matmul_peak`), what the issue's goals are stated against;
- peak memory: the CUDA allocator's peak over the warm-up and timed steps (the graphed optimizer step allocates
  once, while it is captured in the warm-up, and its replays bypass the allocator), and what stays resident
  between steps (weights, optimizer moments, kept gradients) just before the timed steps (none on CPU);
- first step: seconds from the start of a model's build to the end of its first step (build, compile, kernel
  compilation and autotuning), and from the start of the process (zebra's row: the time to first step a user
  waits): what a warm start (the kernel cache, `zebra.core.caches`) shortens.
The recipe's training levers apply to the zebra row (`train.compile` / `compile_sublayers`, `fuse_projections`,
`optimizer_graph`, `fp8`, `activation_checkpointing`: toggle them with `--set train.X=...`); the report lists them.
The comparison model keeps its levers off, except activation checkpointing, which it then applies too.
`--against fla` runs FLA's own model class of the recipe's mixer (`MixerSpec.fla`) built at the recipe's shapes
(`zebra.convert.fla_format.fla_config`); `--against llama` runs transformers' LlamaForCausalLM at Llama-3.2-1B's shape
(SDPA attention, random weights; the dense baseline of the hybrids). Both with the same step code and data, in the
same process, with the levers off (each model in its plain form) and their own FLOPs per token (6 N + causal
attention of their own shapes).

Each row uses its own model's loss path (what `loss.backward()` sees is the summed CE, as the step expects):
- zebra: the trainer's (`zebra.train.step.zebra_loss_sum`): `model(input_ids, shift_labels, num_items_in_batch=1)`
  in training mode, i.e. the chunked linear cross-entropy (`zebra_kernels.linear_cross_entropy`, with FLA's
  Triton cross-entropy kernels per chunk on the fla backend) on the final hidden states: no `[B, T, V]` logits.
  All T positions.
- fla and llama: their defaults (`labels_loss_sum`): `model(input_ids, labels=...)`, so the `[B, T, V]` logits,
  then the model's own cross entropy (FLA's fused Triton one; transformers' float32 one), the mean over
  non-ignored targets, multiplied back by their count. Both shift `labels` by one inside and leave the last
  position without a target, so they score T-1 of the T positions (the same targets as the zebra row for
  positions 0..T-2); their loss_mask drops position T-1 so the reported loss is the mean over the targets scored.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from zebra.convert.fla_format import fla_config, fla_mixers
from zebra.core.caches import use_kernel_cache
from zebra.core.errors import ZebraError
from zebra.mixers import MIXERS, MLP
from zebra.recipes import load_recipe
from zebra.spec import arch
from zebra.train.dist import DistEnv
from zebra.train.metrics import device_peak_flops, process_seconds
from zebra.train.optim import build_optimizer, build_scheduler
from zebra.train.parallelize import eager_float8_note, parallelize
from zebra.train.step import TrainStep
from zebra.train.trainer import build_model, kernels_in_use


@dataclass(kw_only=True)
class TrainBenchConfig:
    """Arguments of one bench run (see `zebra bench train --help`)."""

    recipe: str
    steps: int = 20
    warmup: int = 3
    batch: int | None = None  # default: the recipe's micro batch
    seq_len: int | None = None  # default: the recipe's sequence length
    against: str | None = None  # "fla" or "llama"
    overrides: list[str] = field(default_factory=list)
    seed: int = 0


AGAINST = ("fla", "llama")
LEVERS = (
    "activation_checkpointing",
    "compile",
    "compile_sublayers",
    "fuse_projections",
    "optimizer_graph",
    "fp8",
    "fp8_sublayers",
    "fp8_recipe",
)
# Llama-3.2-1B's architecture (its config.json), randomly initialised: the dense baseline of `--against llama`
LLAMA_3_2_1B = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
)


@dataclass
class TrainBenchRow:
    model: str
    params: int
    flops_per_token: float  # of this model: 6 N + causal attention
    tokens_per_s: float
    step_ms: float
    tflops: float  # achieved model FLOP/s (flops_per_token x tokens/s), in TFLOP/s
    mfu: float | None  # against the datasheet peak
    mfu_measured: float | None  # against the bf16 matmul peak measured in the run
    peak_memory_gb: float | None
    resident_gb: float | None  # allocated just before the timed steps: weights, optimizer moments, kept grads
    loss: float  # of the last timed step
    first_step_s: float  # from the start of this model's build to the end of its first step
    first_step_process_s: float | None  # from the start of the process to the end of its first step (Linux)
    # the first step's parts: the model's build, then the step's set-up (optimizer, levers such as compile
    # wrappers); the rest of first_step_s is the first step itself (kernel loading or compiling, autotuning)
    build_s: float | None = None
    step_setup_s: float | None = None


@dataclass
class TrainBenchReport:
    recipe: str
    device: str
    precision: str
    batch: int
    seq_len: int
    steps: int
    warmup: int
    flops_per_token: float
    peak_flops: float | None
    measured_peak_flops: float | None
    levers: dict[str, Any]  # the recipe's training levers of the zebra row (LEVERS) and its kernel backend
    kernels: str  # what that backend runs here: "fla", "fla (Mamba2 scan: mamba_ssm)", "torch"
    torch_version: str
    rows: list[TrainBenchRow]
    kernel_cache: str | None = None  # where compiled kernels and autotuning results persist
    against_error: str | None = None  # why the comparison model has no row (it ran out of memory)
    notes: list[str] = field(default_factory=list)  # what the trainer would warn about these levers

    @property
    def ratio(self) -> float | None:
        """Zebra tokens/s over the comparison model's (None without --against)."""
        return self.rows[0].tokens_per_s / self.rows[1].tokens_per_s if len(self.rows) > 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def check_fla_comparable(recipe, device=None, *, flag: str = "--against fla") -> str:
    """The recipe's layer pattern, or a ZebraError (naming `flag`) when FLA has no class for it or, with a
    `device`, no kernels there."""
    pattern = arch.resolve_pattern(arch.as_config(recipe.model.flat()))
    mixers = set(pattern[0::2])
    if len(mixers) != 1 or MIXERS[next(iter(mixers))].fla is None or set(pattern[1::2]) != {MLP}:
        labels = " / ".join(m.label for m in fla_mixers().values())
        raise ZebraError(
            f"{flag}: recipe {recipe.name} has pattern {pattern[:16]}...; FLA has classes for pure {labels} "
            "models only",
            fix=f"use a pure recipe ({', '.join(f'tiny-{m.name}' for m in fla_mixers().values())}, 1b-gdn-pure, ...)",
        )
    if device is not None and device.type != "cuda":
        raise ZebraError(
            f"{flag}: FLA's kernels need a GPU (they have no CPU path)",
            fix="run it on a CUDA/ROCm machine",
        )
    return pattern


def fla_model(recipe, device):
    """FLA's own model class at the recipe's shapes (a pure model of a mixer with an FLA adapter), on `device`,
    fp32 weights.

    Built on any device (its forward needs FLA's GPU kernels: check the device with `check_fla_comparable`)."""
    pattern = check_fla_comparable(recipe)
    import fla.models

    adapter = MIXERS[pattern[0]].fla
    cfg = fla_config(recipe.model.to_config(), pattern)
    cfg.pop("architectures")
    cfg.pop("model_type")
    cls_config = getattr(fla.models, adapter.config_class)
    cls_model = getattr(fla.models, adapter.architecture)
    torch.manual_seed(recipe.train.seed)
    with torch.device(device):
        return cls_model(cls_config(**cfg)).train()


def llama_model(device, seed: int, **overrides):
    """transformers' LlamaForCausalLM at `LLAMA_3_2_1B` (with `overrides`), SDPA attention, fp32 weights, seeded."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**{**LLAMA_3_2_1B, **overrides})
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()


def llama_flops_per_token(model, seq_len: int) -> float:
    """6 N + causal attention, 3 H (d_qk + d_v) T per layer: `zebra.spec.arch.train_flops_per_token`'s count."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    return 6.0 * params + c.num_hidden_layers * 3 * c.num_attention_heads * 2 * c.head_dim * seq_len


def measured_matmul_peak(device, n: int = 8192, repeats: int = 10) -> float | None:
    """bf16 FLOP/s of an n x n x n matmul on `device` (mean of `repeats` after 3 warm-ups); None on CPU."""
    if device.type != "cuda":
        return None
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize(device)
    return 2.0 * n**3 * repeats / (time.perf_counter() - start)


def labels_loss_sum(model, tokens, labels, loss_mask):
    """An FLA or transformers model's own loss path with its defaults, as the summed CE `TrainStep` expects
    (see the module docstring).

    tokens, labels, loss_mask `[m, T]` (labels[:, t] is position t's target). These models score position t
    against `labels[:, t + 1]` of what they are given, so they get our targets one position later; the last
    position has none.
    """
    targets = labels.masked_fill(loss_mask == 0, -100)  # [m, T]
    shifted = torch.cat([torch.full_like(targets[:, :1], -100), targets[:, :-1]], dim=1)  # [m, T]
    mean = model(input_ids=tokens, labels=shifted, use_cache=False).loss  # over non-ignored targets
    return mean * (targets[:, :-1] != -100).sum()


def make_step(model, recipe, device, *, loss_fn=None, schedule: bool = False, levers: bool = True):
    """The trainer's `TrainStep` on one device for `model`: the recipe's precision (bf16 autocast, fp32 master
    weights), AdamW with its parameter groups, gradient clipping and training levers, and with `schedule` its
    warm-up + decay learning rate (else the peak lr throughout). `loss_fn` as `TrainStep`'s; `levers=False` turns
    compile, fused projections, the optimizer graph and fp8 off (the comparison models' plain form)."""
    t = recipe.train
    if not levers:
        t = dataclasses.replace(t, compile=False, fuse_projections=False, optimizer_graph=False, fp8=False)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=device)
    bf16 = t.precision == "bf16"
    model = parallelize(model, env, mode="none", bf16=bf16, train=t)
    optimizer = build_optimizer(model, t, device)
    return TrainStep(
        model,
        optimizer,
        build_scheduler(optimizer, t) if schedule else None,
        env,
        autocast_bf16=bf16,
        clip_grad=t.clip_grad,
        loss_fn=loss_fn,
        optimizer_graph=t.optimizer_graph,
    )


def training_step(
    model,
    recipe,
    cfg: TrainBenchConfig,
    device,
    *,
    loss_fn=None,
    score_last: bool = True,
    levers: bool = True,
):
    """The step the bench times on `model` (`make_step`) and its one micro-batch of `cfg.batch` x `cfg.seq_len`
    random tokens.

    `loss_fn` and `levers` as `make_step`'s; `score_last=False` masks position T-1 out of the loss (FLA and
    transformers score T-1 of T). Returns (step, micro_batch).
    """
    step = make_step(model, recipe, device, loss_fn=loss_fn, levers=levers)
    B, T = cfg.batch, cfg.seq_len
    gen = torch.Generator().manual_seed(cfg.seed)
    text = torch.randint(0, recipe.model.vocab_size, (B, T + 1), generator=gen)  # [B, T + 1]
    loss_mask = torch.ones(B, T)
    if not score_last:
        loss_mask[:, -1] = 0
    return step, {"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": loss_mask}


@dataclass
class Peaks:
    """The two peaks MFU is reported against (FLOP/s; None where unknown, e.g. CPU)."""

    datasheet: float | None
    measured: float | None


def _measure(
    name: str,
    build: Callable[[], Any],
    flops_of: Callable[[Any], float],
    recipe,
    cfg: TrainBenchConfig,
    device,
    peaks: Peaks,
    **step_kwargs,
) -> TrainBenchRow:
    """Build the model (`build()`), take its FLOPs per token (`flops_of(model)`) and time `training_step` on it
    (`step_kwargs` as there)."""
    first = _FirstStep()
    model = build()
    built = time.perf_counter()
    flops_per_token = flops_of(model)
    params = sum(p.numel() for p in model.parameters())  # tied weights once
    step, batch = training_step(model, recipe, cfg, device, **step_kwargs)
    set_up = time.perf_counter()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(cfg.warmup):
        step([batch]).wait()
        first.done()
    if cuda:
        torch.cuda.synchronize(device)
    resident = torch.cuda.memory_allocated(device) / 2**30 if cuda else None
    start = time.perf_counter()
    previous = None
    for _ in range(cfg.steps):
        result = step([batch])
        if previous is not None:
            previous.wait()  # as the trainer: each step's figures read once the next step is queued
        if first.seconds is None:
            result.wait()
            first.done()
        previous = result
    loss = result.loss
    if cuda:
        torch.cuda.synchronize(device)  # the last optimizer update too
    seconds = time.perf_counter() - start
    tok_s = cfg.batch * cfg.seq_len * cfg.steps / seconds
    achieved = flops_per_token * tok_s
    return TrainBenchRow(
        model=name,
        params=params,
        flops_per_token=flops_per_token,
        tokens_per_s=tok_s,
        step_ms=1000 * seconds / cfg.steps,
        tflops=achieved / 1e12,
        mfu=achieved / peaks.datasheet if peaks.datasheet else None,
        mfu_measured=achieved / peaks.measured if peaks.measured else None,
        peak_memory_gb=torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        resident_gb=resident,
        loss=loss,
        first_step_s=first.seconds,
        first_step_process_s=first.process_seconds,
        build_s=built - first.started,
        step_setup_s=set_up - built,
    )


class _FirstStep:
    """When a model's first step ended: seconds since its build began, and since the process started."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: float | None = None
        self.process_seconds: float | None = None

    def done(self) -> None:
        """A step's figures were just read (it ended); the first call records the times."""
        if self.seconds is None:
            self.seconds = time.perf_counter() - self.started
            self.process_seconds = process_seconds()


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _against_row(cfg: TrainBenchConfig, recipe, device, peaks: Peaks) -> TrainBenchRow:
    """The comparison model's row (`cfg.against`), levers off, its own loss path and FLOPs per token; with the
    recipe's `train.activation_checkpointing` it recomputes its layers too (transformers' gradient checkpointing),
    so that a long sequence compares at equal memory policy."""
    if cfg.against == "fla":
        build_model, name = (
            (lambda: fla_model(recipe, device)),
            f"fla ({MIXERS[arch.resolve_pattern(arch.as_config(recipe.model.flat()))[0]].fla.architecture})",
        )
        same_shapes = arch.train_flops_per_token(arch.as_config(recipe.model.flat()), cfg.seq_len)
        flops_of = lambda _model: same_shapes  # noqa: E731
    else:
        build_model, name = (lambda: llama_model(device, recipe.train.seed)), "llama (LlamaForCausalLM)"
        flops_of = lambda model: llama_flops_per_token(model, cfg.seq_len)  # noqa: E731
    checkpointing = recipe.train.activation_checkpointing

    def build():
        model = build_model()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    return _measure(
        f"{name} + activation checkpointing" if checkpointing else name,
        build,
        flops_of,
        recipe,
        cfg,
        device,
        peaks,
        loss_fn=labels_loss_sum,
        score_last=False,
        levers=False,
    )


def run_train_bench(
    cfg: TrainBenchConfig, *, on_progress: Callable[[float, float | None, str], None] | None = None
) -> TrainBenchReport:
    """Measure the recipe's training step (and FLA's or Llama's with `against`); see the module docstring.

    `on_progress(done, total, note)` is called as each model's measurement starts, with the models done so far.
    """
    progress = on_progress or (lambda _done, _total, _note: None)
    if cfg.against not in (None, *AGAINST):
        raise ZebraError(
            f"--against {cfg.against}: unknown", fix=f"compare with one of: {', '.join(AGAINST)}, or drop it"
        )
    recipe = load_recipe(cfg.recipe, overrides=cfg.overrides)
    cache = use_kernel_cache()
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    kernels = kernels_in_use(recipe.model.to_config(), device)  # a backend that cannot run here: told now
    cfg.batch = cfg.batch or recipe.train.micro_batch_size
    cfg.seq_len = cfg.seq_len or recipe.data.seq_len
    flat = arch.as_config(recipe.model.flat())
    flops = arch.train_flops_per_token(flat, cfg.seq_len)
    notes = [note] if (note := eager_float8_note(arch.resolve_pattern(flat), recipe.train)) else []
    if cfg.against == "fla":
        check_fla_comparable(recipe, device)  # fail before any timing
    peaks = Peaks(device_peak_flops(device), measured_matmul_peak(device))
    models = 2 if cfg.against else 1
    progress(0, models, f"zebra: {cfg.warmup} warm-up + {cfg.steps} timed steps")
    build = lambda: build_model(recipe, device)  # noqa: E731
    rows = [_measure("zebra", build, lambda _model: flops, recipe, cfg, device, peaks)]
    against_error = None
    if cfg.against:
        _free(device)
        progress(1, models, f"{cfg.against}: {cfg.warmup} warm-up + {cfg.steps} timed steps")
        try:
            rows.append(_against_row(cfg, recipe, device, peaks))
        except torch.OutOfMemoryError:  # Llama's full logits at a long sequence: zebra's row still stands
            _free(device)
            against_error = (
                f"{cfg.against} ran out of memory at batch {cfg.batch} x {cfg.seq_len}; compare at a smaller "
                "--batch or --seq-len"
            )
            if not recipe.train.activation_checkpointing:
                against_error += ", or with --set train.activation_checkpointing=true (both models recompute)"
            if "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
                against_error += ", or with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (zebra's freed blocks then serve it)"
    return TrainBenchReport(
        recipe=recipe.name,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        precision=recipe.train.precision,
        batch=cfg.batch,
        seq_len=cfg.seq_len,
        steps=cfg.steps,
        warmup=cfg.warmup,
        flops_per_token=flops,
        peak_flops=peaks.datasheet,
        measured_peak_flops=peaks.measured,
        levers={
            **{k: getattr(recipe.train, k) for k in LEVERS},
            "kernel_backend": recipe.model.kernel_backend,
        },
        kernels=kernels,
        torch_version=torch.__version__,
        rows=rows,
        kernel_cache=cache["TRITON_CACHE_DIR"],
        against_error=against_error,
        notes=notes,
    )
