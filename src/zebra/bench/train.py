"""`zebra bench train`: training throughput of a recipe with the trainer's own step, optionally next to FLA.

What is measured: `warmup` untimed then `steps` timed optimizer steps of one micro-batch each (B random token
sequences of T + 1 tokens, no accumulation), through `zebra.train.step.TrainStep` exactly as the trainer runs
it: the recipe's precision (bf16 autocast, fp32 master weights), AdamW with the trainer's parameter groups
(fused on GPU), gradient clipping, activation checkpointing / torch.compile when the recipe switches them on.
- tokens/s = B * T * steps / seconds (the device synchronises every step, as in training);
- MFU = train_flops_per_token x tokens/s / peak dense bf16 FLOP/s of the device, train_flops_per_token =
  6 N + causal MLA attention (`zebra.arch.train_flops_per_token`, the same count for both models);
- peak memory: the CUDA allocator's peak during the timed steps (none on CPU).
`--against fla` runs FLA's own GatedDeltaNetForCausalLM / KDAForCausalLM built at the recipe's shapes
(`zebra.convert.fla.fla_config`), with the same step code and data, in the same process.

Each row uses its own model's loss path (what `loss.backward()` sees is the summed CE, as the step expects):
- zebra: the trainer's (`zebra.train.step.zebra_loss_sum`): `model(input_ids, shift_labels, num_items_in_batch=1)`
  in training mode, i.e. the chunked linear cross-entropy (`zebra_kernels.linear_cross_entropy`, with FLA's
  Triton cross-entropy kernels per chunk on the fla backend) on the final hidden states: no `[B, T, V]` logits.
  All T positions.
- fla: FLA's defaults (`fla_loss_sum`): `model(input_ids, labels=...)`, so the `[B, T, V]` logits, then FLA's
  fused (Triton) cross entropy, the mean over non-ignored targets, multiplied back by their count. FLA shifts
  `labels` by one inside and leaves the last position without a target, so it scores T-1 of the T positions
  (the same targets as the zebra row for positions 0..T-2); its loss_mask drops position T-1 so the reported
  loss is the mean over the targets scored.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from zebra import arch
from zebra.convert.fla import fla_config
from zebra.errors import ZebraError
from zebra.recipes import load_recipe
from zebra.train.dist import DistEnv
from zebra.train.metrics import device_peak_flops
from zebra.train.optim import build_optimizer
from zebra.train.parallelize import parallelize
from zebra.train.step import TrainStep
from zebra.train.trainer import build_model


@dataclass(kw_only=True)
class TrainBenchConfig:
    """Arguments of one bench run (see `zebra bench train --help`)."""

    recipe: str
    steps: int = 20
    warmup: int = 3
    batch: int | None = None  # default: the recipe's micro batch
    seq_len: int | None = None  # default: the recipe's sequence length
    against: str | None = None  # "fla"
    overrides: list[str] = field(default_factory=list)
    seed: int = 0


@dataclass
class TrainBenchRow:
    model: str
    params: int
    tokens_per_s: float
    step_ms: float
    tflops: float  # achieved model FLOP/s (train_flops_per_token x tokens/s), in TFLOP/s
    mfu: float | None
    peak_memory_gb: float | None
    loss: float  # of the last timed step


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
    torch_version: str
    rows: list[TrainBenchRow]

    @property
    def ratio(self) -> float | None:
        """Zebra tokens/s over FLA tokens/s (None without --against)."""
        return self.rows[0].tokens_per_s / self.rows[1].tokens_per_s if len(self.rows) > 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def check_fla_comparable(recipe, device) -> str:
    """The recipe's layer pattern, or a ZebraError when FLA has no class for it or no kernels on `device`."""
    pattern = arch.resolve_pattern(arch.as_config(recipe.model.flat()))
    mixers = set(pattern[0::2])
    if len(mixers) != 1 or mixers & {"M", "*"} or set(pattern[1::2]) != {"-"}:
        raise ZebraError(
            f"--against fla: recipe {recipe.name} has pattern {pattern[:16]}...; FLA has classes for pure GDN "
            "and pure KDA models only",
            fix="compare a pure recipe (1b-gdn-pure, 1b-kda-pure, tiny-gdn, tiny-kda), or drop --against",
        )
    if device.type != "cuda":
        raise ZebraError(
            "--against fla: FLA's kernels need a GPU (they have no CPU path)",
            fix="run it on a CUDA/ROCm machine",
        )
    return pattern


def fla_model(recipe, device):
    """FLA's own model class at the recipe's shapes (pure GDN or pure KDA only), on `device`, fp32 weights."""
    pattern = check_fla_comparable(recipe, device)
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, KDAConfig, KDAForCausalLM

    cfg = fla_config(recipe.model.to_config(), pattern)
    cfg.pop("architectures")
    cls_config, cls_model = (
        (GatedDeltaNetConfig, GatedDeltaNetForCausalLM)
        if cfg.pop("model_type") == "gated_deltanet"
        else (KDAConfig, KDAForCausalLM)
    )
    torch.manual_seed(recipe.train.seed)
    with torch.device(device):
        return cls_model(cls_config(**cfg)).train()


def fla_loss_sum(model, tokens, labels, loss_mask):
    """FLA's own loss path with its defaults, as the summed CE `TrainStep` expects (see the module docstring).

    tokens, labels, loss_mask `[m, T]` (labels[:, t] is position t's target). FLA scores position t against
    `labels[:, t + 1]` of what it is given, so it gets our targets one position later; the last position has none.
    """
    targets = labels.masked_fill(loss_mask == 0, -100)  # [m, T]
    fla_labels = torch.cat([torch.full_like(targets[:, :1], -100), targets[:, :-1]], dim=1)  # [m, T]
    mean = model(input_ids=tokens, labels=fla_labels, use_cache=False).loss  # over non-ignored targets
    return mean * (targets[:, :-1] != -100).sum()


def training_step(model, recipe, cfg: TrainBenchConfig, device, *, loss_fn=None, score_last: bool = True):
    """The step the bench times on `model` (the trainer's `TrainStep`, the recipe's precision, activation
    checkpointing and compile) and its one micro-batch of `cfg.batch` x `cfg.seq_len` random tokens.

    `loss_fn` as `TrainStep`'s; `score_last=False` masks position T-1 out of the loss (FLA scores T-1 of T).
    Returns (step, micro_batch).
    """
    t = recipe.train
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=device)
    bf16 = t.precision == "bf16"
    model = parallelize(
        model,
        env,
        mode="none",
        bf16=bf16,
        activation_checkpointing=t.activation_checkpointing,
        compile=t.compile,
    )
    step = TrainStep(
        model,
        build_optimizer(model, t, device),
        None,
        env,
        autocast_bf16=bf16,
        clip_grad=t.clip_grad,
        loss_fn=loss_fn,
    )
    B, T = cfg.batch, cfg.seq_len
    gen = torch.Generator().manual_seed(cfg.seed)
    text = torch.randint(0, recipe.model.vocab_size, (B, T + 1), generator=gen)  # [B, T + 1]
    loss_mask = torch.ones(B, T)
    if not score_last:
        loss_mask[:, -1] = 0
    return step, {"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": loss_mask}


def _measure(
    name: str,
    model,
    recipe,
    cfg: TrainBenchConfig,
    device,
    flops_per_token: float,
    peak: float | None,
    *,
    loss_fn=None,
    score_last: bool = True,
) -> TrainBenchRow:
    """Time `training_step` on `model` (arguments as there)."""
    params = sum(p.numel() for p in model.parameters())  # tied weights once
    step, batch = training_step(model, recipe, cfg, device, loss_fn=loss_fn, score_last=score_last)
    for _ in range(cfg.warmup):
        step([batch])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(cfg.steps):
        result = step([batch])  # syncs (the loss and grad norm come to the host)
    seconds = time.perf_counter() - start
    tok_s = cfg.batch * cfg.seq_len * cfg.steps / seconds
    return TrainBenchRow(
        model=name,
        params=params,
        tokens_per_s=tok_s,
        step_ms=1000 * seconds / cfg.steps,
        tflops=flops_per_token * tok_s / 1e12,
        mfu=flops_per_token * tok_s / peak if peak else None,
        peak_memory_gb=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        loss=result.loss,
    )


def run_train_bench(
    cfg: TrainBenchConfig, *, on_progress: Callable[[float, float | None, str], None] | None = None
) -> TrainBenchReport:
    """Measure the recipe's training step (and FLA's with `against="fla"`); see the module docstring.

    `on_progress(done, total, note)` is called as each model's measurement starts, with the models done so far.
    """
    progress = on_progress or (lambda _done, _total, _note: None)
    if cfg.against not in (None, "fla"):
        raise ZebraError(f"--against {cfg.against}: unknown", fix="the only comparison is --against fla")
    recipe = load_recipe(cfg.recipe, overrides=cfg.overrides)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    cfg.batch = cfg.batch or recipe.train.micro_batch_size
    cfg.seq_len = cfg.seq_len or recipe.data.seq_len
    flops = arch.train_flops_per_token(arch.as_config(recipe.model.flat()), cfg.seq_len)
    peak = device_peak_flops(device)
    if cfg.against == "fla":
        check_fla_comparable(recipe, device)  # fail before any timing
    rows = []
    models = 2 if cfg.against == "fla" else 1
    progress(0, models, f"zebra: {cfg.warmup} warm-up + {cfg.steps} timed steps")
    rows.append(_measure("zebra", build_model(recipe, device), recipe, cfg, device, flops, peak))
    if cfg.against == "fla":
        gc.collect()
        torch.cuda.empty_cache()
        progress(1, models, f"fla: {cfg.warmup} warm-up + {cfg.steps} timed steps")
        fla = fla_model(recipe, device)
        name = f"fla ({type(fla).__name__})"
        rows.append(
            _measure(name, fla, recipe, cfg, device, flops, peak, loss_fn=fla_loss_sum, score_last=False)
        )
    return TrainBenchReport(
        recipe=recipe.name,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        precision=recipe.train.precision,
        batch=cfg.batch,
        seq_len=cfg.seq_len,
        steps=cfg.steps,
        warmup=cfg.warmup,
        flops_per_token=flops,
        peak_flops=peak,
        torch_version=torch.__version__,
        rows=rows,
    )
