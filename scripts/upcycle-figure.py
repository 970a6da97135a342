"""The upcycling figure (issue 13): upcycled + distilled students against the same students trained from scratch.

For each mixer (default `mamba` and `gdn`, `--mla 8`): `zebra upcycle` the teacher, distil the student for
`--steps` steps (forward KL, the trainer's loss and step), and train the same architecture from random init with
CE for the same steps and tokens. Held-out CE is measured for the teacher, the upcycled student at step 0, and both
students at several budgets; plus the tokens used, the KV cache as % of the teacher's and greedy decode ms/token
(HF `generate`, batch 1, the same way for every model). Writes OUT/figure.json and OUT/figure.png and prints a table.

    python3 scripts/python-docs-data.py SmolLM2-135M-Instruct.Q4_1.gguf data/   # once, on any CPU machine
    python3 scripts/upcycle-figure.py SmolLM2-135M-Instruct.Q4_1.gguf --train data/train \
        --heldout data/heldout --output figure/         # about 6 minutes per student on one H200

The defaults (256 steps of 8 x 1024 tokens: 2.1M tokens per student, about one pass over the python-docs train
split) are sized for one H200; on a CPU pass tiny numbers (`--steps 2 --batch 2 --seq 32`), as
tests/train/test_upcycle_figure.py does.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def token_stream(target: str):
    """Every token of a prepared folder or Megatron prefix, concatenated (uint16 / int32 numpy array)."""
    import numpy as np

    from zebra.data import resolve_prefixes
    from zebra.data.indexed import check_prefix

    parts = []
    for prefix, _ in resolve_prefixes(target):
        info = check_prefix(prefix)
        dtype = np.uint16 if info.itemsize == 2 else np.int32
        parts.append(np.memmap(prefix + ".bin", dtype=dtype, mode="r"))
    return np.concatenate(parts)


def windows(stream, seq: int, count: int, start: int = 0):
    """`count` consecutive windows of seq + 1 tokens from `start`, wrapping around: [count, seq + 1] int64."""
    import numpy as np
    import torch

    span = seq + 1
    idx = (start + np.arange(count)[:, None] * span + np.arange(span)[None, :]) % len(stream)
    return torch.from_numpy(np.asarray(stream[idx], dtype=np.int64))


def batch_dict(window):
    """A TrainStep micro-batch from [m, seq + 1] tokens."""
    import torch

    tokens, labels = window[:, :-1], window[:, 1:]
    return {"tokens": tokens, "labels": labels, "loss_mask": torch.ones_like(tokens, dtype=torch.float32)}


def decode_ms(model, device, new_tokens: int, bf16: bool) -> float:
    """Greedy decode ms/token at batch 1 after an 8-token prompt (HF generate with its cache; one warm-up)."""
    import torch

    prompt = torch.arange(1, 9, device=device)[None]
    model.eval()
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        model.generate(prompt, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(prompt, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start) / new_tokens


def train_curve(model, loss_fn, args, stream, heldout, device, lr: float) -> list[dict]:
    """Train `model` for args.steps steps (the trainer's TrainStep, AdamW, warm-up + cosine) and measure
    held-out CE at the budgets; returns [{step, tokens, heldout_ce}] from step 0."""
    from zebra.eval.ce import heldout_ce
    from zebra.recipes.schema import TrainSpec
    from zebra.train.dist import DistEnv
    from zebra.train.optim import build_optimizer, build_scheduler
    from zebra.train.step import TrainStep

    bf16 = device.type == "cuda"
    spec = TrainSpec(max_steps=args.steps, lr=lr, min_lr=lr / 10, warmup_steps=max(1, args.steps // 20))
    optimizer = build_optimizer(model, spec, device)
    step = TrainStep(model, optimizer, build_scheduler(optimizer, spec), DistEnv(0, 0, 1, device),
                     autocast_bf16=bf16, clip_grad=1.0, loss_fn=loss_fn)  # fmt: skip
    budgets = sorted({args.steps, *(max(1, args.steps * k // 8) for k in (1, 2, 4))})
    curve = [{"step": 0, "tokens": 0, "heldout_ce": heldout_ce(model, heldout, device, bf16)}]
    for n in range(1, args.steps + 1):
        model.train()
        window = windows(stream, args.seq, args.batch, start=(n - 1) * args.batch * (args.seq + 1))
        step([batch_dict(window)])
        if n in budgets:
            tokens = n * args.batch * args.seq
            curve.append(
                {"step": n, "tokens": tokens, "heldout_ce": heldout_ce(model, heldout, device, bf16)}
            )
            print(f"  step {n}: held-out CE {curve[-1]['heldout_ce']:.4f}", flush=True)
    return curve


def run_mixer(mixer: str, args, teacher, stream, heldout, device) -> dict:
    """Upcycle, distil and train from scratch one student; its figures."""
    import torch

    from zebra.models import ZebraConfig, ZebraForCausalLM
    from zebra.train.distill import DistillLoss, DistillWeights
    from zebra.upcycle import StudentOptions, upcycle

    export = args.output / f"upcycled-{mixer}"
    report = upcycle(args.teacher, export, StudentOptions(mixer=mixer, mla=args.mla), dtype="fp32", force=True,
                     calibration=svd_calibration(args))  # fmt: skip
    print(f"{mixer}: upcycled ({report.student_params / 1e6:.1f}M parameters), distilling", flush=True)
    student = ZebraForCausalLM.from_pretrained(export, dtype=torch.float32).to(device)
    kd = train_curve(
        student, DistillLoss(teacher, DistillWeights()), args, stream, heldout, device, args.kd_lr
    )
    bf16 = device.type == "cuda"
    decode = decode_ms(student, device, args.decode_tokens, bf16)
    del student
    print(f"{mixer}: from scratch", flush=True)
    torch.manual_seed(0)
    scratch_model = ZebraForCausalLM(ZebraConfig.from_pretrained(export)).to(device)
    scratch = train_curve(scratch_model, None, args, stream, heldout, device, args.scratch_lr)
    return {
        "mixer": mixer,
        "pattern": report.pattern,
        "svd": report.svd,
        "student_params": report.student_params,
        "kv_cache_percent": 100 * report.kv_cache_fraction,
        "decode_ms_per_token": decode,
        "upcycled_step0_ce": kd[0]["heldout_ce"],
        "kd": kd,
        "scratch": scratch,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.axhline(result["teacher"]["heldout_ce"], color="black", linestyle=":", label="teacher")
    for i, s in enumerate(result["students"]):
        for key, style, what in (("kd", "-o", "upcycled + KD"), ("scratch", "--s", "scratch (CE)")):
            points = [(p["tokens"] / 1e6, p["heldout_ce"]) for p in s[key]]
            ax.plot(
                *zip(*points, strict=True), style, color=f"C{i}", label=f"{s['mixer']} {what}", markersize=4
            )
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("held-out CE (nats/token)")
    ax.set_title(f"upcycled + distilled vs from scratch, teacher {Path(result['teacher']['path']).name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def table(result: dict) -> str:
    t = result["teacher"]
    lines = [f"teacher: held-out CE {t['heldout_ce']:.4f}, decode {t['decode_ms_per_token']:.2f} ms/token",
             f"{'student':<8} {'tokens':>10} {'step-0 CE':>10} {'KD CE':>8} {'scratch CE':>10} {'KD/teacher':>10} "
             f"{'KV %':>6} {'ms/tok':>7}"]  # fmt: skip
    for s in result["students"]:
        kd, scratch = s["kd"][-1], s["scratch"][-1]
        lines.append(
            f"{s['mixer']:<8} {kd['tokens']:>10,} {s['upcycled_step0_ce']:>10.4f} {kd['heldout_ce']:>8.4f} "
            f"{scratch['heldout_ce']:>10.4f} {kd['heldout_ce'] / t['heldout_ce']:>10.3f} "
            f"{s['kv_cache_percent']:>6.2f} {s['decode_ms_per_token']:>7.2f}"
        )
    return "\n".join(lines)


def figure_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of both figure scripts (this and pipeline-figure.py): the teacher, the tokenized texts, the
    output folder, the batch shape, the held-out size, the MLA factorisation and the device."""
    import torch

    p = argparse.ArgumentParser(description=description)
    p.add_argument("teacher", help="the teacher (.gguf, HF folder or hub id)")
    p.add_argument("--train", required=True, help="tokenized training text (prep folder or prefix)")
    p.add_argument("--heldout", required=True, help="tokenized held-out text (prep folder or prefix)")
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heldout-windows", type=int, default=32, help="held-out sequences of --seq tokens")
    p.add_argument("--svd", choices=("plain", "activation"), default="plain", help="zebra upcycle --svd")
    p.add_argument(
        "--svd-samples", type=int, default=32, help="--svd activation: sequences of 512 --train tokens"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def svd_calibration(args):
    """`upcycle`'s calibration for `--svd activation` (`--svd-samples` sequences of the training text), or None."""
    from zebra.upcycle.calibration import Calibration

    if args.svd != "activation":
        return None
    return Calibration(args.train, samples=args.svd_samples, device=args.device)


def open_inputs(args, device):
    """The held-out windows `[W, seq + 1]` and the teacher on `device`, for a parsed `figure_parser`."""
    from zebra.train.dist import DistEnv
    from zebra.train.distill_teacher import load_teacher

    held = token_stream(args.heldout)
    heldout = windows(held, args.seq, min(args.heldout_windows, max(1, len(held) // (args.seq + 1))))
    return heldout, load_teacher(args.teacher, DistEnv(0, 0, 1, device), mode="none")


def run_facts(args, device, heldout) -> dict:
    """The settings, the device name and the held-out token count every figure's JSON records."""
    import torch

    return {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "heldout_tokens": int(heldout[:, 1:].numel()),
    }


def save(result: dict, output: Path) -> None:
    """figure.json (written whole, then renamed) and figure.png of the students so far."""
    from zebra.core.atomic import write_atomic

    write_atomic(output / "figure.json", json.dumps(result, indent=2) + "\n")
    plot(result, output / "figure.png")


def main() -> None:
    import torch

    from zebra.eval.ce import heldout_ce

    p = figure_parser(__doc__.splitlines()[0])
    p.add_argument("--mixers", default="mamba,gdn")
    p.add_argument("--mla", type=int, default=8)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--kd-lr", type=float, default=2e-4, help="peak LR of distillation")
    p.add_argument("--scratch-lr", type=float, default=1e-3, help="peak LR of the from-scratch CE runs")
    p.add_argument("--decode-tokens", type=int, default=64)
    args = p.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    stream = token_stream(args.train)
    heldout, teacher = open_inputs(args, device)
    bf16 = device.type == "cuda"
    result = {
        "teacher": {
            "path": str(args.teacher),
            "heldout_ce": heldout_ce(teacher, heldout, device, bf16),
            "decode_ms_per_token": decode_ms(teacher, device, args.decode_tokens, bf16),
        },
        **run_facts(args, device, heldout),
        "students": [],
    }
    print(f"teacher: held-out CE {result['teacher']['heldout_ce']:.4f}", flush=True)
    for mixer in args.mixers.split(","):
        result["students"].append(run_mixer(mixer, args, teacher, stream, heldout, device))
        save(result, args.output)  # after every student: a run cut short keeps the students it finished
    print(table(result))
    print(f"wrote {args.output / 'figure.json'} and {args.output / 'figure.png'}")


if __name__ == "__main__":
    main()
