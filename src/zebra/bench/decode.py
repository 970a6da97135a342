"""`zebra bench decode`: prefill and decode speed of the engine next to HF `generate`, against the memory roofline.

What is measured, per batch size B (random prompt ids, greedy, no stop token, one warm-up run first):
- engine prefill: `Engine.prefill` of B x P tokens into a fresh cache; tokens/s = B * P / seconds.
- engine decode: N one-token steps as a streaming caller runs them (sample, copy the token to the host, feed it);
  ms/token = seconds / N (one step emits B tokens), tokens/s = B * N / seconds.
- cache: bytes the engine's cache holds after P + N tokens, next to `zebra.arch.decode_cache` (latents in the
  model dtype, states in float32) times B. A static cache is allocated for P + N tokens up front.
- HF: `model.generate(max_new_tokens=N, min_new_tokens=N)` on the same model, each token time-stamped by a
  streamer: prefill = prompt to first new token, decode ms/token = first to last new token / (N - 1).
- roofline: bytes one decode step must read (every weight once; the lm_head read, the embedding table not, when
  untied) plus the cache (states read and written, latents read at the mean context length), divided by the
  bandwidth of a large device-to-device copy measured in the same run (2 x bytes / seconds).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from zebra import arch
from zebra.device import resolve_device, resolve_dtype
from zebra.errors import ZebraError
from zebra.generation import Engine, SamplingParams, sample_next_token
from zebra.generation.loading import load_model
from zebra.models import ZebraForCausalLM
from zebra.recipes import load_recipe


@dataclass(kw_only=True)
class DecodeBenchConfig:
    """Arguments of one bench run (see `zebra bench decode --help`)."""

    model: str
    batches: list[int] = field(default_factory=lambda: [1, 8])
    prompt: int = 2048
    new: int = 256
    dtype: str = "bf16"
    device: str | None = None
    hf: bool = True
    cache: str = "auto"
    cuda_graph: bool = True
    compile: bool = False
    seed: int = 0


@dataclass
class DecodeBenchRow:
    batch: int
    prefill_tokens_per_s: float
    prefill_ms: float
    decode_ms_per_token: float
    decode_tokens_per_s: float
    cache_bytes: int
    cache_bytes_arch: int | None  # zebra models only
    roofline_ms: float
    roofline_ratio: float  # measured decode ms / roofline ms
    peak_memory_bytes: int | None
    hf_decode_ms_per_token: float | None = None
    hf_prefill_ms: float | None = None
    speedup_vs_hf: float | None = None


@dataclass
class DecodeBenchReport:
    model: str
    device: str
    dtype: str
    params: int
    weight_bytes_per_step: int
    bandwidth_gb_s: float
    prompt: int
    new: int
    cache: str
    cuda_graph: bool
    compile: bool
    torch_version: str
    rows: list[DecodeBenchRow]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_decode_bench(
    cfg: DecodeBenchConfig, on_progress: Callable[[float, float | None, str], None] | None = None
) -> DecodeBenchReport:
    """Measure the engine (and HF generate) on cfg.model for every batch size; see the module docstring.

    `on_progress(done, total, note)` is called as each phase starts (build, bandwidth, then one engine run and
    one HF run per batch size), with the phases done so far.
    """
    phases = 2 + len(cfg.batches) * (2 if cfg.hf else 1)
    done = 0

    def say(note: str) -> None:
        nonlocal done
        if on_progress is not None:
            on_progress(done, phases, note)
        done += 1

    if cfg.prompt < 1 or cfg.new < 2 or not cfg.batches or min(cfg.batches) < 1:
        raise ZebraError(
            "need --prompt >= 1, --new >= 2 and batch sizes >= 1",
            fix="e.g. --batch 1,8 --prompt 2048 --new 256",
        )
    if cfg.cache not in ("auto", "static", "dynamic"):
        raise ZebraError(f"--cache {cfg.cache}: unknown", fix="use auto, static or dynamic")
    device = resolve_device(cfg.device)
    say(f"building {cfg.model} on {device}")
    model = build_model(cfg.model, device=device, dtype=cfg.dtype, seed=cfg.seed)
    if cfg.cache == "static" and model.config.model_type != "zebra":
        raise ZebraError(
            f"--cache static: needs a zebra model, not {model.config.model_type}", fix="use --cache auto"
        )
    engine = Engine(
        model,
        cache=cfg.cache,
        cuda_graph=cfg.cuda_graph,
        compile=cfg.compile,
        max_seq_len=cfg.prompt + cfg.new,
    )
    say("measuring memory bandwidth")
    bandwidth = measure_bandwidth(engine.device)
    weight_bytes = weight_bytes_per_step(model)
    gen = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for batch in cfg.batches:
        prompts = torch.randint(0, model.config.vocab_size, (batch, cfg.prompt), generator=gen)
        say(f"engine, batch {batch}")
        row = _bench_engine(engine, prompts, cfg.new, weight_bytes, bandwidth)
        if cfg.hf:
            say(f"HF generate, batch {batch}")
            row.hf_prefill_ms, row.hf_decode_ms_per_token = _bench_hf(model, prompts, cfg.new)
            row.speedup_vs_hf = row.hf_decode_ms_per_token / row.decode_ms_per_token
        rows.append(row)
    return DecodeBenchReport(
        model=cfg.model,
        device=device_name(engine.device),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        params=sum(p.numel() for p in model.parameters()),
        weight_bytes_per_step=weight_bytes,
        bandwidth_gb_s=bandwidth / 1e9,
        prompt=cfg.prompt,
        new=cfg.new,
        cache=engine.cache_kind,
        cuda_graph=engine.cuda_graph,
        compile=engine.compiled,
        torch_version=torch.__version__,
        rows=rows,
    )


def build_model(spec: str, *, device: str, dtype: str, seed: int = 0) -> torch.nn.Module:
    """A model directory (export / FLA / run) loaded, or a recipe name/YAML built with random weights."""
    if Path(spec).is_dir():
        model, _ = load_model(spec, device=device, dtype=dtype, tokenizer=False)
        return model
    try:
        recipe = load_recipe(spec)
    except ZebraError as e:
        raise ZebraError(
            f"MODEL {spec}: not a model directory, and not a recipe ({e.message})",
            fix="pass an export / FLA / run directory or a recipe name (zebra recipes list)",
        ) from None
    torch.manual_seed(seed)
    with torch.device(device):
        model = ZebraForCausalLM(recipe.model.to_config())
    td = resolve_dtype(dtype)
    if td is not None:
        model.to(td)
    return model.eval()


@torch.inference_mode()
def _bench_engine(
    engine: Any, prompts: torch.Tensor, new: int, weight_bytes: int, bandwidth: float
) -> DecodeBenchRow:
    batch, prompt_len = prompts.shape
    greedy = SamplingParams()
    device = engine.device

    def one_run(n_new: int) -> tuple[float, float, Any]:
        state = engine.new_state(batch, capacity=prompt_len + new)
        ids = prompts.to(device)
        _sync(device)
        t0 = time.perf_counter()
        engine.prefill(state, ids)
        _sync(device)
        t1 = time.perf_counter()
        for _ in range(n_new):
            nxt = sample_next_token(state.logits, greedy)
            nxt.tolist()  # a streaming caller needs the tokens on the host every step
            engine.step(state, nxt)
        _sync(device)
        return t1 - t0, time.perf_counter() - t1, state

    _reset_peak(device)
    one_run(min(new, 8))  # warm-up: kernels, autotuning, CUDA graph capture
    prefill_s, decode_s, state = one_run(new)
    cache_bytes = engine.cache_bytes(state)
    ms = decode_s / new * 1e3
    arch_bytes = None
    if getattr(engine.config, "model_type", None) == "zebra":
        element = next(engine.model.parameters()).element_size()
        arch_cache = arch.decode_cache(engine.config, prompt_len + new, dtype_bytes=element)
        arch_bytes = batch * arch_cache.per_sequence
        # per step: states read + written, latents read at the mean context length
        mean_len = prompt_len + new / 2
        step_cache = batch * (2 * arch_cache.fixed_per_sequence + arch_cache.per_token * mean_len)
    else:  # other models: the measured cache, read and written once
        step_cache = 2 * cache_bytes
    roofline_ms = (weight_bytes + step_cache) / bandwidth * 1e3
    return DecodeBenchRow(
        batch=batch,
        prefill_tokens_per_s=batch * prompt_len / prefill_s,
        prefill_ms=prefill_s * 1e3,
        decode_ms_per_token=ms,
        decode_tokens_per_s=batch * new / decode_s,
        cache_bytes=cache_bytes,
        cache_bytes_arch=arch_bytes,
        roofline_ms=roofline_ms,
        roofline_ratio=ms / roofline_ms,
        peak_memory_bytes=_peak(device),
    )


@torch.inference_mode()
def _bench_hf(model: Any, prompts: torch.Tensor, new: int) -> tuple[float, float]:
    """HF `generate` (greedy, its own cache): (prefill ms, decode ms per token), timed per token by a streamer."""
    device = next(model.parameters()).device
    ids = prompts.to(device)
    clock = _TokenClock(device)

    def run(n: int) -> None:
        clock.reset()
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            streamer=clock,
        )

    run(2)  # warm-up
    run(new)
    t = clock.stamps  # [start, first new token, ..., last new token]
    return (t[1] - t[0]) * 1e3, (t[-1] - t[1]) / (len(t) - 2) * 1e3


class _TokenClock:
    """A `generate` streamer that only records when each new token arrives (the first `put` is the prompt)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stamps: list[float] = []

    def reset(self) -> None:
        _sync(self.device)
        self.stamps = []

    def put(self, _tokens: torch.Tensor) -> None:
        _sync(self.device)
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Weight bytes one decode step reads: every parameter once, less an untied input embedding table."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == embed.data_ptr()
    return total if tied else total - embed.numel() * embed.element_size()


def measure_bandwidth(device: torch.device, nbytes: int | None = None) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted): the roofline's denominator."""
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 1 << 27)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
