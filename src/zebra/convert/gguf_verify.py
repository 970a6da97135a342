"""`zebra verify FILE.gguf --against SRC`: the GGUF run by llama.cpp (llama-cpp-python) against its Zebra source.

llama.cpp tokenises the prompts with the tokenizer inside the file (they must be Zebra's ids), computes every
position's logits (`logits_all`), and continues greedily through its own cached decode path. The source runs in
`ZebraForCausalLM` in float64 (the reference) and float32; as for the native exports (`native_verify`), the
float32-vs-float64 difference of the source in the same run is the noise floor, and a float32 GGUF passes at
`GGUF_NOISE_FACTOR` times it. llama.cpp's kernels sum in other orders than torch's: measured on the trained tiny
models (docs/formats.md), GDN, Mamba2 and KDA + MLA came within the floor (0.4x), with llama.cpp's KV cache in
float32 (its default float16 cache put KDA + MLA at 53x), while a wrong permutation or sign costs 1e-2 to 1, 10^4
floors and more. A float16 or quantised GGUF is held to `QUANT_THRESHOLDS`, and its greedy tokens are reported,
not required.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from zebra.convert import native_verify as nv
from zebra.convert.formats import open_checkpoint
from zebra.convert.verifier import VerifyReport, _compare, _load
from zebra.core.cpus import usable_cpus
from zebra.core.errors import ZebraError
from zebra.data.tokenizers import load_tokenizer

GGUF_NOISE_FACTOR = 100.0
N_CTX = 512
# relative max |diff| and cosine a quantised GGUF must reach (GGML type name -> thresholds), about 3x the worst
# measured on tiny-gdn, tiny-mamba and tiny-kimi trained 4 and 20 steps (docs/formats.md): F16 6.3e-4 and
# 1 - cosine 8.7e-9, BF16 5.4e-3 and 4.9e-7, Q8_0 7.3e-3 and 3.7e-6, 4 and 5 bits 0.21 and 4.7e-4 (relative to the
# largest logit: larger on the less trained models, whose logits are smaller). Two swapped GDN output-gate heads
# cost 0.10 and 2.4e-4: Q8_0 and the 16-bit types catch that, 4 and 5 bits only gross mistakes; exactness is the
# float32 file's check. The k-quants (llama.cpp's quantizer, on the same recipes widened to 256 so their matrices
# take them), worst of the files holding each (with their fallback types): Q6_K 3.0e-2 and 2.4e-5, Q5_K 4.2e-2
# and 3.4e-5, Q4_K 5.3e-2 and 6.9e-5.
QUANT_THRESHOLDS = {
    "F16": (2e-3, 1 - 1e-7),
    "BF16": (1.5e-2, 1 - 2e-6),
    "Q8_0": (2e-2, 1 - 2e-5),
    "Q6_K": (0.1, 1 - 1e-4),
    "Q5_K": (0.15, 1 - 1.5e-4),
    "Q4_K": (0.2, 1 - 2e-4),
    **dict.fromkeys(("Q5_0", "Q5_1", "Q4_0", "Q4_1"), (0.5, 1 - 1.5e-3)),
}
UNMEASURED = (0.5, 0.99)  # types Zebra does not write (a file from llama-quantize: Q3_K, IQ4_XS, ...)


def open_llama(path: Path) -> Any:
    """The GGUF in llama-cpp-python, every position's logits kept, its KV cache in float32 (llama.cpp's default
    float16 cache rounds every cached key and value of an attention layer: 53x the noise floor on tiny-kimi, 0.4x
    with float32)."""
    try:
        from llama_cpp import GGML_TYPE_F32, Llama
    except ImportError:
        raise ZebraError(
            f"{path}: running a GGUF needs llama-cpp-python",
            fix="pip install llama-cpp-python (built from source: README.md says how long it takes)",
        ) from None
    return Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, logits_all=True, verbose=False,
                 n_threads=usable_cpus(), type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)  # fmt: skip


def llama_logits(llm: Any, ids: list[int]) -> torch.Tensor:
    """llama.cpp's logits at every position of `ids` (one sequence, from an empty state)."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    return torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float64))[None]  # [1, T, V]


def llama_greedy(llm: Any, ids: list[int], max_new_tokens: int) -> list[int]:
    """llama.cpp's greedy continuation, one token at a time through its recurrent state / KV cache."""
    llm.reset()
    llm.eval(ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        new.append(int(llm.scores[llm.n_tokens - 1].argmax()))
        llm.eval(new[-1:])
    return new


def _stored_types(path: Path) -> set[str]:
    import gguf

    return {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def verify_gguf(
    path: Path, against: Path | None, prompts: tuple[str, ...], max_new_tokens: int
) -> VerifyReport:
    """Run the GGUF in llama.cpp; with `against`, compare its logits and greedy tokens with the Zebra source."""
    path = Path(path)
    llm = open_llama(path)
    arch = llm.metadata.get("general.architecture", "?")
    report = VerifyReport(str(path), "gguf", "cpu", f"llama.cpp ({arch}) against ZebraForCausalLM in float64")
    inputs = [llm.tokenize(p.encode(), add_bos=True, special=False) for p in prompts]
    ours = llama_logits(llm, inputs[0])
    probs = ours[0, -1].softmax(-1)
    top = probs.topk(5)
    report.top5 = [
        {"id": int(i), "text": llm.detokenize([int(i)]).decode(errors="replace"), "prob": float(p)}
        for p, i in zip(top.values, top.indices, strict=True)
    ]
    report.prompt = prompts[0]
    report.continuation_ids = llama_greedy(llm, inputs[0], max_new_tokens)
    report.continuation = llm.detokenize(report.continuation_ids).decode(errors="replace")
    if against is not None:
        _parity(report, llm, path, Path(against), prompts, inputs, max_new_tokens)
    return report


def _parity(report, llm, path: Path, against: Path, prompts, inputs, max_new_tokens: int) -> None:
    src = open_checkpoint(against)
    tok = load_tokenizer(src.tokenizer) if src.tokenizer else None
    if tok is not None:
        for prompt, ids in zip(prompts, inputs, strict=True):
            if tok(prompt)["input_ids"] != ids:
                report.problems.append(
                    f"tokens of {prompt!r} differ: llama.cpp {ids}, Zebra {tok(prompt)['input_ids']}"
                )
    zebra = _load(src, "cpu")
    batches = [torch.tensor([ids]) for ids in inputs]
    z32, z64 = nv.logits(zebra, batches), nv.logits(nv.float64_copy(zebra), batches)
    floor = nv.max_abs(z32, z64)
    theirs = [llama_logits(llm, ids) for ids in inputs]
    quantised = sorted(_stored_types(path) - {"F32"})
    parity = _compare(z64, theirs, f"{against} (ZebraForCausalLM float64)", f"{path} (llama.cpp)", "float32")
    parity.noise_floor = floor
    if not quantised:
        scale = float(max(z.abs().max() for z in z64)) or 1.0
        parity.threshold_rel = GGUF_NOISE_FACTOR * max(floor, 1e-12) / scale
        report.notes.append(
            f"noise floor (the source's float32 vs float64 logits, this run): max |diff| {floor:.3g}; a float32 "
            f"GGUF passes at <= {GGUF_NOISE_FACTOR:g}x that ({GGUF_NOISE_FACTOR * floor:.3g}): it measured "
            f"{parity.max_abs:.3g}"
        )
    else:
        rels, cosines = zip(*(QUANT_THRESHOLDS.get(q, UNMEASURED) for q in quantised), strict=True)
        parity.threshold_rel, parity.threshold_cosine = max(rels), min(cosines)
        report.notes.append(
            f"quantised ({', '.join(quantised)}): held to the thresholds measured for the type"
        )
    report.parities.append(parity)
    mine = nv.zebra_greedy(zebra, batches[0], max_new_tokens)
    if report.continuation_ids == mine:
        report.notes.append(f"greedy {max_new_tokens} tokens: identical (llama.cpp's cached decode)")
    elif quantised:
        report.notes.append(
            f"greedy tokens differ (quantised): llama.cpp {report.continuation_ids}, Zebra {mine}"
        )
    else:
        report.problems.append(f"greedy tokens differ: llama.cpp {report.continuation_ids}, Zebra {mine}")
