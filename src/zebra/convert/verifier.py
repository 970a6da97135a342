"""`verify`: is a converted checkpoint complete, and does it compute what its source computes?

1. Audit: the checkpoint's tensor names and shapes against the class that will load it (ZebraForCausalLM for
   Zebra exports, FLA's real GatedDeltaNetForCausalLM / KDAForCausalLM for FLA directories), on the meta device.
2. Parity: logits on fixed prompts against `--against SRC` (any convertible source), as max |difference|,
   max |difference| relative to the largest reference logit, and cosine similarity, with dtype-aware thresholds.
   Both sides run ZebraForCausalLM loaded from their own weights. For an FLA directory on a GPU, FLA's own
   forward (its Triton kernels) is compared with ours as well; on a CPU it cannot run, and the report says so.
3. A sample: the next-token top-5 and a short greedy continuation, decoded when a tokenizer is present.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zebra.convert import native_verify as nv
from zebra.convert.audit import Audit, audit, expected_shapes, meta_model, zebra_audit
from zebra.convert.formats import Checkpoint, open_checkpoint
from zebra.convert.native import MODEL_TYPES
from zebra.convert.tensor_sources import SafetensorsSource
from zebra.core.device import resolve_device
from zebra.core.errors import ZebraError
from zebra.data.tokenizers import has_tokenizer_files, load_tokenizer
from zebra.folders.model_folder import config_model_type
from zebra.models import ZebraForCausalLM

DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Zebras are")

# dtype of the least precise weights involved -> (max |diff| / max |reference logit|, minimum cosine).
THRESHOLDS = {
    "float64": (1e-9, 0.999999),
    "float32": (1e-4, 0.99999),
    "float16": (1e-2, 0.9999),
    "bfloat16": (5e-2, 0.999),
}
# Two different implementations (FLA's forward vs ours: other kernels, fused norms, TF32 on some GPUs) agree
# less tightly than one implementation on two copies of the same weights.
CROSS_THRESHOLDS = {
    "float64": (1e-6, 0.99999),
    "float32": (2e-3, 0.9999),
    "float16": (2e-2, 0.999),
    "bfloat16": (5e-2, 0.999),
}
_PRECISION_ORDER = ("bfloat16", "float16", "float32", "float64")


@dataclass
class Parity:
    """One logits comparison over all prompts and positions; `problem` says why the logits could not be
    compared at all (then the numbers are None and the check fails)."""

    reference: str
    candidate: str
    max_abs: float | None
    max_rel: float | None
    cosine: float | None
    threshold_rel: float
    threshold_cosine: float
    problem: str | None = None
    noise_floor: float | None = None  # native exports: the source's float32-vs-float64 max |diff| in this run

    @property
    def ok(self) -> bool:
        if self.problem is not None or self.max_rel is None or self.cosine is None:
            return False
        return self.max_rel <= self.threshold_rel and self.cosine >= self.threshold_cosine

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}


@dataclass
class VerifyReport:
    directory: str
    format: str
    device: str
    mode: str
    audits: list[Audit] = field(default_factory=list)
    parities: list[Parity] = field(default_factory=list)
    top5: list[dict[str, Any]] = field(default_factory=list)
    prompt: str = ""
    continuation: str = ""
    continuation_ids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # failed checks besides the audits and parities

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.audits) and all(p.ok for p in self.parities) and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "format": self.format,
            "device": self.device,
            "mode": self.mode,
            "ok": self.ok,
            "audits": [a.to_dict() for a in self.audits],
            "parity": [p.to_dict() for p in self.parities],
            "prompt": self.prompt,
            "top5": self.top5,
            "continuation": self.continuation,
            "continuation_ids": self.continuation_ids,
            "notes": self.notes,
            "problems": self.problems,
        }


def verify(
    directory: str | Path,
    *,
    against: str | Path | None = None,
    prompts: list[str] | tuple[str, ...] = DEFAULT_PROMPTS,
    device: str | None = None,
    max_new_tokens: int = 12,
    tokenizer: str | None = None,
) -> VerifyReport:
    """Audit `directory`, compare its logits with `against`, and sample from it.

    Args:
        directory: a converted checkpoint (Zebra export or FLA directory; any convertible format works), or a
            transformers-native export (`zebra convert --to qwen3-next | qwen3.5 | bamba | granite-hybrid |
            kimi-linear`): its own class against `against` in float64 with the measured float32 noise floor
            (`native_verify`).
        against: the source it was converted from (optional; without it there is no parity check, except
            FLA-vs-ours on a GPU).
        prompts: texts to run (tokenised with the directory's tokenizer; fixed token ids when there is none).
        device: "cpu", "cuda", "cuda:N"; None or "auto": CUDA when available.
        max_new_tokens: length of the greedy continuation.
        tokenizer: a tokenizer to use when the directory has none.
    """
    if any(not p for p in prompts):  # told before anything is loaded
        raise ZebraError("--prompt '': an empty prompt", fix="give some text, e.g. --prompt 'Zebras are'")
    device = resolve_device(device)
    directory = Path(directory)
    if config_model_type(directory) in MODEL_TYPES.values():
        return _verify_native(directory, against, prompts, device, max_new_tokens, tokenizer)
    ckpt = open_checkpoint(directory)
    on_gpu = device.startswith("cuda")
    mode = "ZebraForCausalLM forward"
    if ckpt.format == "fla":
        mode = (
            "FLA's own forward (Triton kernels) and ZebraForCausalLM loaded from the FLA weights"
            if on_gpu
            else "CPU: FLA classes used for the audit only (their kernels need a GPU); logits from "
            "ZebraForCausalLM loaded from the FLA weights"
        )
    report = VerifyReport(str(directory), ckpt.format, device, mode, notes=list(ckpt.notes))
    report.audits.append(_audit(ckpt, directory))
    report.audits[-1].subject = str(directory)
    tok = _tokenizer(tokenizer or ckpt.tokenizer, report)
    precision = _weights_dtype(ckpt)
    model = _load(ckpt, device)
    inputs = _encode(prompts, tok, model.config.vocab_size)
    ours = _logits(model, inputs)
    _check_finite(model, ours, str(directory), report)
    if against is not None:
        src = open_checkpoint(against)
        report.audits.append(zebra_audit(_shapes(src), src.config, subject=f"{against} ({src.format})"))
        lowest = min(precision, _weights_dtype(src), key=_PRECISION_ORDER.index)
        ref_name = f"{against} ({src.format})"
        # other vocabularies: the logits cannot be compared, nor the prompt's ids shared
        if src.config.vocab_size != ckpt.config.vocab_size:
            src.tensors.close()
            rel, cos = THRESHOLDS[lowest]
            problem = f"vocabularies differ ({src.config.vocab_size} vs {ckpt.config.vocab_size})"
            report.parities.append(Parity(ref_name, str(directory), None, None, None, rel, cos, problem))
            report.notes.append(f"logits not compared with {against}: {problem}")
        else:
            ref_model = _load(src, device)
            ref = _logits(ref_model, inputs)
            _check_finite(ref_model, ref, ref_name, report)
            report.parities.append(_compare(ref, ours, ref_name, f"{directory}", lowest))
            del ref_model
    if ckpt.format == "fla" and on_gpu:
        fla_model = _load_fla(directory, device)
        fla = _logits(fla_model, inputs)
        report.parities.append(
            _compare(fla, ours, "FLA forward", "ZebraForCausalLM", precision, thresholds=CROSS_THRESHOLDS)
        )
        del fla_model
    _sample(model, inputs[0], tok, report, max_new_tokens, prompts[0] if tok is not None else None)
    return report


def _shapes(ckpt: Checkpoint) -> dict[str, tuple[int, ...]]:
    return {k: s for k, (s, _) in ckpt.tensors.shapes().items()}


def _audit(ckpt: Checkpoint, directory: Path) -> Audit:
    """FLA directories against FLA's class (raw FLA names); everything else against ZebraForCausalLM."""
    if ckpt.format != "fla":
        return zebra_audit(_shapes(ckpt), ckpt.config)
    try:
        import fla  # noqa: F401  (registers FLA's model types)
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        return zebra_audit(_shapes(ckpt), ckpt.config)
    config = AutoConfig.from_pretrained(directory)
    model = meta_model(AutoModelForCausalLM.from_config, config)
    expected, tied = expected_shapes(model)
    raw = {k: s for k, (s, _) in ckpt.tensors.base.shapes().items()}
    return audit(raw, expected, tied=tied, target=f"{type(model).__name__} (FLA)")


def _weights_dtype(ckpt: Checkpoint) -> str:
    dtypes = {
        str(dt).removeprefix("torch.") for _, dt in ckpt.tensors.shapes().values() if dt.is_floating_point
    }
    return min(dtypes or {"float32"}, key=_PRECISION_ORDER.index)


def _load(ckpt: Checkpoint, device: str) -> Any:
    """ZebraForCausalLM with `ckpt`'s weights in float32 (torch kernels on CPU, auto on GPU)."""
    config = copy.deepcopy(ckpt.config)
    config.kernel_backend = "auto" if device.startswith("cuda") else "torch"
    model = ZebraForCausalLM(config)
    state = {k: ckpt.tensors.get(k).to(torch.float32) for k in ckpt.tensors.shapes()}
    ckpt.tensors.close()
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = [
        (k, tuple(v.shape), expected[k])
        for k, v in state.items()
        if k in expected and tuple(v.shape) != expected[k]
    ]
    if wrong:
        name, got, want = wrong[0]
        more = f"; {len(wrong) - 1} more" if len(wrong) > 1 else ""
        raise ZebraError(
            f"{ckpt.path}: weights do not fit its config.json ({name} is {list(got)}, the config makes {list(want)}{more})",
            fix="use the config.json the weights were saved with (or re-run zebra convert)",
        )
    result = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        names = ", ".join([*missing[:3], *result.unexpected_keys[:3]])
        raise ZebraError(
            f"{ckpt.path}: weights do not fit ZebraForCausalLM ({names})", fix="re-run zebra convert"
        )
    model.tie_weights()
    return model.to(device=device, dtype=torch.float32).eval()


def _load_fla(directory: Path, device: str) -> Any:
    import fla  # noqa: F401
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(device).eval()


def _tokenizer(name: str | None, report: VerifyReport) -> Any:
    if name is None:
        report.notes.append("no tokenizer: prompts replaced by fixed token ids, output shown as ids")
        return None
    return load_tokenizer(str(name))


def _encode(prompts, tok, vocab: int) -> list[Any]:
    if tok is None:
        gen = torch.Generator().manual_seed(1234)
        return [torch.randint(0, min(vocab, 256), (1, 8 + 3 * i), generator=gen) for i in range(len(prompts))]
    encoded = [tok(p, add_special_tokens=True)["input_ids"] for p in prompts]
    if empty := next((p for p, ids in zip(prompts, encoded, strict=True) if not ids), None):
        raise ZebraError(f"--prompt {empty!r}: the tokenizer makes no tokens of it", fix="give some text")
    return [torch.tensor([ids], dtype=torch.long) for ids in encoded]


def _logits(model: Any, inputs: list[Any]) -> list[Any]:
    device = next(model.parameters()).device
    with torch.no_grad():
        return [model(input_ids=ids.to(device)).logits.float().cpu() for ids in inputs]


def _check_finite(model: Any, logits: list[Any], name: str, report: VerifyReport) -> None:
    """A failed check when the logits hold NaN or infinities (corrupt weights), naming the weights that do."""
    if all(bool(torch.isfinite(x).all()) for x in logits):
        return
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    where = f" (non-finite weights: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''})" if bad else ""
    report.problems.append(f"{name}: the logits hold NaN or infinite values{where}")


def _compare(ref, out, ref_name: str, out_name: str, dtype: str, thresholds=THRESHOLDS) -> Parity:
    a = torch.cat([r.reshape(-1) for r in ref]).double()
    b = torch.cat([o.reshape(-1) for o in out]).double()
    max_abs = float((a - b).abs().max())
    scale = float(a.abs().max()) or 1.0
    cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    rel, cos = thresholds[dtype]
    return Parity(ref_name, out_name, max_abs, max_abs / scale, cosine, rel, cos)


def _sample(model, ids, tok, report: VerifyReport, max_new_tokens: int, prompt: str | None) -> None:
    device = next(model.parameters()).device
    with torch.no_grad():
        probs = model(input_ids=ids.to(device)).logits[0, -1].float().softmax(-1).cpu()
        top = probs.topk(5)
        report.top5 = [
            {"id": int(i), "text": tok.decode([int(i)]) if tok else None, "prob": float(p)}
            for p, i in zip(top.values, top.indices, strict=True)
        ]
        seq = ids.to(device)
        for _ in range(max_new_tokens):  # plain greedy with full recompute: no cache needed
            nxt = model(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    new = seq[0, ids.shape[1] :].tolist()
    report.prompt = prompt if prompt is not None else " ".join(map(str, ids[0].tolist()))
    report.continuation_ids = new
    report.continuation = tok.decode(new) if tok else " ".join(map(str, new))


def _verify_native(
    directory: Path, against, prompts, device: str, max_new_tokens: int, tokenizer
) -> VerifyReport:
    """A transformers-native export (`zebra.convert.native_verify`): its own class against the Zebra source."""
    weights = SafetensorsSource(directory)
    shapes = {k: s for k, (s, _) in weights.shapes().items()}
    weights.close()
    model = nv.load_native(directory, device)
    arch = type(model).__name__
    mode = f"{arch} (transformers, no trust_remote_code) in float32 against ZebraForCausalLM in float64"
    report = VerifyReport(str(directory), "native", device, mode)
    report.audits.append(nv.native_audit(directory, shapes))
    report.audits[-1].subject = str(directory)
    tok = _tokenizer(tokenizer or (str(directory) if has_tokenizer_files(directory) else None), report)
    inputs = _encode(prompts, tok, model.config.vocab_size)
    ours = nv.logits(model, inputs)
    _check_finite(model, ours, str(directory), report)
    if against is not None:
        _native_parity(report, directory, against, model, inputs, ours, device, max_new_tokens)
    probs = ours[0][0, -1].softmax(-1)
    top = probs.topk(5)
    report.top5 = [
        {"id": int(i), "text": tok.decode([int(i)]) if tok else None, "prob": float(p)}
        for p, i in zip(top.values, top.indices, strict=True)
    ]
    new = nv.cached_greedy(model, inputs[0].to(device), max_new_tokens)
    report.prompt = prompts[0] if tok is not None else " ".join(map(str, inputs[0][0].tolist()))
    report.continuation_ids = new
    report.continuation = tok.decode(new) if tok else " ".join(map(str, new))
    return report


def _native_parity(report, directory, against, model, inputs, ours, device: str, max_new_tokens: int) -> None:
    """Logits against the source in float64 with the measured float32 noise floor as the bar; greedy tokens."""
    src = open_checkpoint(against)
    report.audits.append(zebra_audit(_shapes(src), src.config, subject=f"{against} ({src.format})"))
    ref_name = f"{against} ({src.format}, ZebraForCausalLM float64)"
    out_name = f"{directory} ({type(model).__name__} float32)"
    if src.config.vocab_size != model.config.vocab_size:
        src.tensors.close()
        problem = f"vocabularies differ ({src.config.vocab_size} vs {model.config.vocab_size})"
        report.parities.append(Parity(ref_name, out_name, None, None, None, 0.0, 1.0, problem))
        return
    stored = min(_weights_dtype(src), _native_dtype(directory), key=_PRECISION_ORDER.index)
    zebra = _load(src, device)
    z32, z64 = nv.logits(zebra, inputs), nv.logits(nv.float64_copy(zebra), inputs)
    floor = nv.max_abs(z32, z64)
    parity = _compare(z64, ours, ref_name, out_name, "float32")
    scale = float(max(z.abs().max() for z in z64)) or 1.0
    if stored in ("float32", "float64"):
        parity.threshold_rel = nv.NOISE_FACTOR * max(floor, 1e-12) / scale
        parity.noise_floor = floor
        report.notes.append(
            f"noise floor (the source's float32 vs float64 logits, this run): max |diff| {floor:.3g}; the export "
            f"passes at <= {nv.NOISE_FACTOR:g}x that ({nv.NOISE_FACTOR * floor:.3g}): it measured {parity.max_abs:.3g}"
        )
    else:
        parity.threshold_rel, parity.threshold_cosine = THRESHOLDS[stored]
    report.parities.append(parity)
    theirs = nv.cached_greedy(model, inputs[0].to(device), max_new_tokens)
    mine = nv.zebra_greedy(zebra, inputs[0].to(device), max_new_tokens)
    if theirs != mine:
        report.problems.append(
            f"greedy tokens differ: {type(model).__name__} {theirs}, ZebraForCausalLM {mine}"
        )
    else:
        report.notes.append(
            f"greedy {max_new_tokens} tokens: identical ({type(model).__name__} generate() with a cache)"
        )


def _native_dtype(directory: Path) -> str:
    weights = SafetensorsSource(directory)
    try:
        dtypes = {
            str(dt).removeprefix("torch.") for _, dt in weights.shapes().values() if dt.is_floating_point
        }
    finally:
        weights.close()
    return min(dtypes or {"float32"}, key=_PRECISION_ORDER.index)
