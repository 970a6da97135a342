"""`zebra bench decode`: prefill and decode speed of the engine next to HF `generate`, against the memory roofline.

What is measured, per batch size B (random prompt ids, greedy, no stop token, one warm-up run first):
- engine prefill: `Engine.prefill` of B x P tokens into a fresh cache; tokens/s = B * P / seconds.
- engine step: N one-token `Engine.step` calls, each fed the argmax of the last logits on the device, with no
  host read in between (one synchronisation at the end): the model's own step, graph replay included;
  ms/token = seconds / N (one step emits B tokens).
- engine decode: the full `Engine.generate` loop that `zebra generate` and chat run (token choice, the copy of
  every token to the host, stop checks, streaming), timed from its first yielded column to its last:
  ms/token = seconds / (N - 1), tokens/s = B * (N - 1) / seconds. `loop_over_step` = decode / step.
- cache: bytes the engine's cache holds after P + N tokens, next to `zebra.spec.arch.decode_cache` (latents in the
  model dtype, states in float32) times B. A static cache is allocated for P + N tokens up front.
- HF: `model.generate(max_new_tokens=N, min_new_tokens=N)` on the same model, each token time-stamped by a
  streamer: prefill = prompt to first new token, decode ms/token = first to last new token / (N - 1).
- FLA (zebra models of one mixer with an FLA adapter, `MixerSpec.fla`: GDN, KDA, GLA; on a GPU): the model's
  weights written by `zebra convert --to fla`, loaded with FLA's own class (GatedDeltaNetForCausalLM /
  KDAForCausalLM / GLAForCausalLM), timed with HF `generate` as above.
  Hybrids and other models get a note instead (FLA has no class for them).
- `--against llama`: Llama-3.2-1B's shape (`zebra.bench.train.LLAMA_3_2_1B`, random weights in the same dtype,
  transformers' LlamaForCausalLM with SDPA), HF `generate` with a static KV cache on the same prompts, timed as
  above; its KV cache is 2 x layers x KV heads x head dim x (P + N) x B elements. `speedup_vs_llama` = Llama
  ms / engine decode ms.
- roofline: bytes one decode step must read (every weight once; the lm_head read, the embedding table not, when
  untied) plus the cache (states read and written, latents read at the mean context length), divided by the
  bandwidth of a large device-to-device copy measured in the same run (2 x bytes / seconds);
  `roofline_ratio` = step ms / roofline ms.
- `--lengths` (`zebra.bench.decode_length`): batch-1 step ms at each cached length in a large static cache against
  one sized to the prompt (MLA decode reads only the cached tokens: the ratio should stay near 1).
- `--profile` (`zebra.bench.decode_profile`): the kernels of one step at the first batch size (calls and
  microseconds per step), next to that row's roofline.
- `--fused-decode`: every row with the decode GEMVs on Zebra's kernels (`zebra_kernels.gemv`, see
  `zebra.models.layers.packed.use_fused_decode`: the pre-norms, the gated output norms and SwiGLU inside the
  projections), HF generate's rows too (the same model), FLA's class not. Compare it with a run without it on
  the same machine.
"""

from __future__ import annotations

import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from zebra.bench.decode_length import LengthRow, length_rows
from zebra.bench.decode_profile import DecodeProfile, profile_step
from zebra.bench.decode_runs import engine_runs, sync
from zebra.core.caches import use_kernel_cache
from zebra.core.device import resolve_device, resolve_dtype
from zebra.core.errors import ZebraError
from zebra.folders.model_folder import model_dir_or_recipe
from zebra.generation import Engine
from zebra.generation.loading import load_model
from zebra.models import ZebraForCausalLM
from zebra.models.layers.packed import use_fused_decode
from zebra.spec import arch


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
    lengths: list[int] = field(default_factory=list)  # cached tokens of the real-length figure (batch 1)
    capacity: int | None = None  # the large cache of that figure (default: the longest length + new)
    profile: bool = False  # the per-kernel breakdown of one step at the first batch size
    against: str | None = None  # "llama": Llama-3.2-1B's shape with a static KV cache beside the engine
    fused_decode: bool = False  # Zebra's decode GEMVs (`zebra.models.layers.packed.use_fused_decode`)


@dataclass
class DecodeBenchRow:
    batch: int
    prefill_tokens_per_s: float
    prefill_ms: float
    step_ms_per_token: float  # Engine.step fed on the device, no host reads
    step_tokens_per_s: float
    decode_ms_per_token: float  # the Engine.generate loop users run
    decode_tokens_per_s: float
    loop_over_step: float  # decode ms / step ms
    cache_bytes: int
    cache_bytes_arch: int | None  # zebra models only
    roofline_ms: float
    roofline_ratio: float  # step ms / roofline ms
    peak_memory_bytes: int | None
    hf_decode_ms_per_token: float | None = None
    hf_prefill_ms: float | None = None
    speedup_vs_hf: float | None = None  # HF ms / engine decode ms
    fla_decode_ms_per_token: float | None = None
    speedup_vs_fla: float | None = None  # FLA ms / engine decode ms
    llama_prefill_tokens_per_s: float | None = None  # --against llama
    llama_decode_ms_per_token: float | None = None
    llama_kv_cache_bytes: int | None = None
    speedup_vs_llama: float | None = None  # Llama ms / engine decode ms


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
    fused_decode: bool
    rows: list[DecodeBenchRow]
    fla: str | None = None  # FLA's class that ran, or why it did not
    llama: str | None = None  # --against llama: what ran
    length_rows: list[LengthRow] = field(default_factory=list)  # --lengths
    profile: DecodeProfile | None = None  # --profile

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_decode_bench(
    cfg: DecodeBenchConfig, on_progress: Callable[[float, float | None, str], None] | None = None
) -> DecodeBenchReport:
    """Measure the engine (and HF generate, and FLA's class) on cfg.model for every batch size; see the module
    docstring.

    `on_progress(done, total, note)` is called as each phase starts (build, bandwidth, FLA's model, then one
    engine run, one HF run and one FLA run per batch size), with the phases done so far.
    """
    check_decode_config(cfg)
    device = resolve_device(cfg.device)
    use_kernel_cache()
    llama = cfg.against == "llama"
    phases = 3 + llama + len(cfg.batches) * (1 + 2 * cfg.hf + llama) + cfg.profile + len(cfg.lengths)
    progress = _Progress(on_progress, phases)
    progress.say(f"building {cfg.model} on {device}")
    model = build_model(cfg.model, device=device, dtype=cfg.dtype, seed=cfg.seed)
    use_fused_decode(model, cfg.fused_decode)
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
    progress.say("measuring memory bandwidth")
    bandwidth = measure_bandwidth(engine.device)
    weight_bytes = weight_bytes_per_step(model)
    progress.say("FLA's model class (from zebra convert --to fla)")
    fla, fla_note = fla_twin(model) if cfg.hf else (None, "skipped (--no-hf)")
    if llama:
        progress.say("Llama-3.2-1B's shape")
        llama_lm, llama_note = llama_twin(next(model.parameters()), cfg.prompt + cfg.new, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for batch in cfg.batches:
        prompts = torch.randint(0, model.config.vocab_size, (batch, cfg.prompt), generator=gen)
        progress.say(f"engine, batch {batch}")
        row = _bench_engine(engine, prompts, cfg.new, weight_bytes, bandwidth)
        if cfg.hf:
            progress.say(f"HF generate, batch {batch}")
            row.hf_prefill_ms, row.hf_decode_ms_per_token = _bench_hf(model, prompts, cfg.new)
            row.speedup_vs_hf = row.hf_decode_ms_per_token / row.decode_ms_per_token
            progress.say(f"FLA's class with HF generate, batch {batch}")
            if fla is not None:
                row.fla_decode_ms_per_token = _bench_hf(fla, prompts, cfg.new)[1]
                row.speedup_vs_fla = row.fla_decode_ms_per_token / row.decode_ms_per_token
        if llama:
            progress.say(f"Llama-3.2-1B's shape with a static KV cache, batch {batch}")
            ids = prompts % llama_lm.config.vocab_size
            prefill_ms, row.llama_decode_ms_per_token = _bench_hf(llama_lm, ids, cfg.new, static=True)
            row.llama_prefill_tokens_per_s = ids.numel() / (prefill_ms / 1e3)
            row.llama_kv_cache_bytes = kv_cache_bytes(llama_lm, batch, cfg.prompt + cfg.new)
            row.speedup_vs_llama = row.llama_decode_ms_per_token / row.decode_ms_per_token
        rows.append(row)
    profile = _profile(engine, model, cfg, rows[0], gen, progress) if cfg.profile else None
    lengths = []
    if cfg.lengths:
        capacity = cfg.capacity or max(cfg.lengths) + cfg.new
        lengths = length_rows(
            model, cfg.lengths, capacity, cfg.new, cuda_graph=cfg.cuda_graph, compile=cfg.compile,
            seed=cfg.seed, say=progress.say,
        )  # fmt: skip
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
        fused_decode=cfg.fused_decode,
        rows=rows,
        fla=fla_note,
        llama=llama_note if llama else None,
        length_rows=lengths,
        profile=profile,
    )


def _profile(engine, model, cfg, row: DecodeBenchRow, gen, progress) -> DecodeProfile:
    """The step's kernel breakdown at the first batch size, next to its roofline; without the graph when a
    graph replay shows no kernels to the profiler."""
    progress.say(f"profile of one step, batch {row.batch}")
    prompts = torch.randint(0, model.config.vocab_size, (row.batch, cfg.prompt), generator=gen)
    profile = profile_step(engine, prompts, cfg.new)
    if profile.kernels_per_step == 0 and engine.cuda_graph:
        eager = Engine(model, cache=cfg.cache, cuda_graph=False, max_seq_len=cfg.prompt + cfg.new)
        profile = profile_step(eager, prompts, cfg.new)
    profile.roofline_ms = row.roofline_ms
    return profile


class _Progress:
    """`on_progress(done, total, note)` as each phase starts."""

    def __init__(self, on_progress, total: int):
        self.on_progress, self.total, self.done = on_progress, total, 0

    def say(self, note: str) -> None:
        if self.on_progress is not None:
            self.on_progress(self.done, self.total, note)
        self.done += 1


def check_decode_config(cfg: DecodeBenchConfig) -> None:
    """A one-line ZebraError naming the flag of a value the bench cannot run (before any model loads)."""
    for flag, value, least in (("--prompt", cfg.prompt, 1), ("--new", cfg.new, 2)):
        if value < least:
            raise ZebraError(f"{flag} {value}: must be at least {least}", fix="e.g. --prompt 2048 --new 256")
    if not cfg.batches or min(cfg.batches) < 1:
        raise ZebraError(
            f"--batch {','.join(map(str, cfg.batches))}: batch sizes must be at least 1",
            fix="e.g. --batch 1,8",
        )
    if cfg.cache not in ("auto", "static", "dynamic"):
        raise ZebraError(f"--cache {cfg.cache}: unknown", fix="use auto, static or dynamic")
    if cfg.lengths and min(cfg.lengths) < 1:
        raise ZebraError(
            f"--lengths {cfg.lengths}: cached lengths must be at least 1", fix="e.g. --lengths 1024,8192"
        )
    if cfg.against not in (None, "llama"):
        raise ZebraError(f"--against {cfg.against}: unknown", fix="use --against llama, or leave it out")
    if cfg.lengths and cfg.capacity is not None and cfg.capacity < max(cfg.lengths) + cfg.new:
        raise ZebraError(
            f"--capacity {cfg.capacity}: smaller than the longest length + --new ({max(cfg.lengths) + cfg.new})",
            fix="raise --capacity or leave it out",
        )


def fla_twin(model: torch.nn.Module) -> tuple[Any, str]:
    """FLA's own class with `model`'s weights, through `zebra convert --to fla` (written to a temporary folder
    and loaded back in `model`'s dtype on its device), and a note naming it; or (None, why not)."""
    from zebra.convert import convert, export_hf
    from zebra.convert.fla_format import fla_config

    device = next(model.parameters()).device
    if getattr(model.config, "model_type", None) != "zebra":
        return None, f"not run: MODEL is a {model.config.model_type} model, not a zebra one"
    try:
        fla_config(model.config, arch.resolve_pattern(model.config))
    except ZebraError as e:
        return None, f"not run: {e.message}"
    if device.type != "cuda":
        return None, "not run: FLA's kernels need a GPU"
    import fla  # noqa: F401  (registers FLA's model types with the Auto classes)
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="zebra-bench-fla-") as tmp:
        src = export_hf(model.state_dict(), model.config, f"{tmp}/zebra", tokenizer="none")
        fla_dir = convert(src, "fla", f"{tmp}/fla").output
        dtype = next(model.parameters()).dtype
        twin = AutoModelForCausalLM.from_pretrained(str(fla_dir), dtype=dtype).to(device).eval()
    return twin, f"{type(twin).__name__} (zebra convert --to fla), HF generate"


def llama_twin(like: torch.Tensor, context: int, seed: int) -> tuple[Any, str]:
    """Llama-3.2-1B's shape, random weights in `like`'s dtype on its device, its context at least `context`;
    and a note naming it."""
    from zebra.bench import train

    positions = max(train.LLAMA_3_2_1B["max_position_embeddings"], context)
    model = train.llama_model(like.device, seed, max_position_embeddings=positions).to(like.dtype).eval()
    return model, f"{type(model).__name__} at Llama-3.2-1B's shape (SDPA), HF generate with a static KV cache"


def kv_cache_bytes(model: Any, batch: int, tokens: int) -> int:
    """Bytes of a Llama model's static KV cache: keys and values of every layer, `tokens` positions."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * tokens * batch * element


def build_model(spec: str, *, device: str, dtype: str, seed: int = 0) -> torch.nn.Module:
    """A model directory (export / FLA / run) loaded, or a recipe name/YAML built with random weights."""
    found = model_dir_or_recipe(spec)
    if isinstance(found, Path):
        model, _ = load_model(found, device=device, dtype=dtype, with_tokenizer=False)
        return model
    recipe = found
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
    _reset_peak(engine.device)
    capacity = prompt_len + new
    engine_runs(engine, prompts, min(new, 8), capacity)  # warm-up: kernels, autotuning, CUDA graph capture
    prefill_s, step_s, state = engine_runs(engine, prompts, new, capacity)
    cache_bytes = engine.cache_bytes(state)
    decode_s = _generate_seconds(engine, prompts, new)
    step_ms, decode_ms = step_s / new * 1e3, decode_s / (new - 1) * 1e3
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
        step_ms_per_token=step_ms,
        step_tokens_per_s=batch * new / step_s,
        decode_ms_per_token=decode_ms,
        decode_tokens_per_s=batch * (new - 1) / decode_s,
        loop_over_step=decode_ms / step_ms,
        cache_bytes=cache_bytes,
        cache_bytes_arch=arch_bytes,
        roofline_ms=roofline_ms,
        roofline_ratio=step_ms / roofline_ms,
        peak_memory_bytes=_peak(engine.device),
    )


def _generate_seconds(engine: Any, prompts: torch.Tensor, new: int) -> float:
    """Seconds from the first to the last column of `Engine.generate` (greedy, no stop ids, `new` tokens), after
    a short warm-up call (the token chooser's capture)."""
    rows = prompts.tolist()
    for _ in engine.generate(rows, max_new_tokens=min(new, 8)):
        pass
    stamps = [time.perf_counter() for _ in engine.generate(rows, max_new_tokens=new)]
    if len(stamps) != new:
        raise RuntimeError(f"Engine.generate yielded {len(stamps)} columns, not {new}")
    return stamps[-1] - stamps[0]


@torch.inference_mode()
def _bench_hf(model: Any, prompts: torch.Tensor, new: int, static: bool = False) -> tuple[float, float]:
    """HF `generate` (greedy, its own cache, or a static one sized to the prompt and `new`): (prefill ms, decode
    ms per token), timed per token by a streamer."""
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
            **({"cache_implementation": "static"} if static else {}),
        )

    # warm-up. transformers compiles the decode step for a static cache on a GPU, and the cache is sized to prompt +
    # new: a shorter warm-up would compile for another shape and leave the timed run to compile again
    run(new if static else 2)
    run(new)
    t = clock.stamps  # [start, first new token, ..., last new token]
    return (t[1] - t[0]) * 1e3, (t[-1] - t[1]) / (len(t) - 2) * 1e3


class _TokenClock:
    """A `generate` streamer that only records when each new token arrives (the first `put` is the prompt)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stamps: list[float] = []

    def reset(self) -> None:
        sync(self.device)
        self.stamps = []

    def put(self, _tokens: torch.Tensor) -> None:
        sync(self.device)
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
    sync(device)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
