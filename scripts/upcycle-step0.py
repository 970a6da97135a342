"""Step-0 held-out CE of upcycled students (no training): the tables of docs/upcycle.md.

Two tables:

- `--table forms`: every MLA form on an all-MLA student (`--mla-layers all`): plain or activation-aware SVD, with
  and without the latent RMSNorms, at the default and at full ranks;
- `--table calibrate`: the hybrids (`--mixers mamba,gdn`, `--mla 8` by default, default ranks) as upcycled and
  after `--calibrate` (gates + per-layer fit);
- `--table compose`: what `zebra distill` composes before ILD: per mixer, the all-MLA and the all-recurrent student
  each calibrated (OUT/MIXER-mla, OUT/MIXER-rec), then `compose(..., mla=--mla, placement=P)` for each P of
  `--placement` (even, smart, or both: OUT/MIXER-hybrid-P).

Each student is written by `zebra.upcycle.upcycle` (what `zebra upcycle` runs) into OUT, loaded back from its
export and scored on the first `--windows` windows of `--seq` tokens of the held-out data, beside the teacher.
Writes OUT/step0-TABLE.json and prints a table.

    python3 scripts/python-docs-data.py SmolLM2-135M-Instruct.Q4_1.gguf data/
    python3 scripts/upcycle-step0.py SmolLM2-135M-Instruct.Q4_1.gguf --calibration data/train \\
        --heldout data/heldout --table calibrate --output step0/
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def heldout_windows(spec: str, tokenizer, seq: int, count: int):
    """`[count, seq + 1]` token windows from the start of a prepared folder / prefix, or of a text file
    tokenized with the teacher's tokenizer."""
    import numpy as np
    import torch

    path = Path(spec)
    if path.is_file() and path.suffix not in (".bin", ".idx"):
        ids = np.asarray(tokenizer(path.read_text())["input_ids"], dtype=np.int64)
    else:
        from zebra.upcycle.calibration import calibration_tokens

        return calibration_tokens(spec, tokenizer, 1 << 30, count, seq + 1)
    if len(ids) < count * (seq + 1):
        raise SystemExit(f"{spec}: {len(ids)} tokens, fewer than {count} x {seq + 1}")
    return torch.from_numpy(ids[: count * (seq + 1)]).view(count, seq + 1)


def forms(args) -> list[tuple[str, dict]]:
    """(label, upcycle keyword arguments) of every all-MLA form."""
    from zebra.upcycle.calibration import Calibration
    from zebra.upcycle.student import StudentOptions

    activation = Calibration(args.calibration, samples=args.svd_samples, seq_len=512)
    out = []
    for svd in ("plain", "activation"):
        for norm in (False, True):
            for ranks, q, kv in (("default", None, None), ("full", args.full_q_rank, args.full_kv_rank)):
                options = StudentOptions(mla_layers="all", latent_norm=norm, q_lora_rank=q, kv_lora_rank=kv)
                label = f"all MLA, {svd} SVD, {'latent norms' if norm else 'no latent norms'}, {ranks} ranks"
                out.append(
                    (label, {"options": options, "calibration": activation if svd == "activation" else None})
                )
    return out


def calibrate_options(args):
    """The `CalibrateOptions` of the command line."""
    from zebra.upcycle.calibrate import CalibrateOptions
    from zebra.upcycle.fit import FitOptions

    fit = FitOptions(steps=args.steps, eval_every=args.eval_every or args.steps, lr=args.lr, batch=args.fit_batch,
                     schedule=args.schedule, output_lstsq=args.output_lstsq, pass_through=args.pass_through)  # fmt: skip
    return CalibrateOptions(args.calibration, samples=args.samples, seq_len=args.calibrate_seq_len, fit=fit,
                            sequential=args.sequential, correct_residual=args.correct_residual)  # fmt: skip


def hybrids(args) -> list[tuple[str, dict]]:
    """(label, upcycle keyword arguments) of each hybrid as upcycled and calibrated."""
    from zebra.upcycle.student import StudentOptions

    calibrate = calibrate_options(args)
    out = []
    for mixer in args.mixers.split(","):
        options = StudentOptions(mixer=mixer, mla=args.mla)
        if not args.calibrated_only:
            out.append((f"{mixer} + {args.mla} MLA, upcycled", {"options": options}))
        out.append((f"{mixer} + {args.mla} MLA, calibrated", {"options": options, "calibrate": calibrate}))
    return out


def calibrated_students(args, teacher, mixer: str) -> dict:
    """The all-MLA and the all-recurrent student of `mixer` (OUT/MIXER-mla, OUT/MIXER-rec), each calibrated, as
    the pipeline's upcycle stages do; returns the calibration records {"mla": ..., "rec": ...}."""
    import torch

    from zebra.upcycle.run import upcycle_teacher
    from zebra.upcycle.student import StudentOptions

    calibrate = calibrate_options(args)
    records = {}
    for role, student in (("mla", {"mla_layers": "all"}), ("rec", {"mla": 0})):
        torch.manual_seed(0)
        report = upcycle_teacher(teacher, args.output / f"{mixer}-{role}", StudentOptions(mixer=mixer, **student),
                                 dtype="fp32", force=True, calibrate=calibrate, on_calibrate=progress_printer())  # fmt: skip
        records[role] = report.calibration.get("layers", [])
    return records


def composed_student(args, mixer: str, placement: str):
    """The hybrid of the two calibrated students of `mixer` with `--mla` MLA layers placed by `placement` (SMART
    scores the layers on `--smart-samples` sequences of 256 tokens of the calibration data), and its MLA layers."""
    import torch

    from zebra.models import ZebraForCausalLM
    from zebra.upcycle.compose import compose

    out = args.output / f"{mixer}-hybrid-{placement}"
    report = compose(args.output / f"{mixer}-mla", args.output / f"{mixer}-rec", out, mla=args.mla,
                     placement=placement, calibration=args.calibration, samples=args.smart_samples, seq_len=256,
                     device="auto", force=True)  # fmt: skip
    return ZebraForCausalLM.from_pretrained(out, dtype=torch.float32), report.mla_layers


def in_memory_student(teacher, kwargs):
    """The student `upcycle` would write, built in memory from the same tensor sources (no export written)."""
    import torch

    from zebra.models import ZebraConfig, ZebraForCausalLM
    from zebra.upcycle.calibrate import CalibratedSource, calibrate_student
    from zebra.upcycle.calibration import attention_input_moments
    from zebra.upcycle.source import UpcycledSource
    from zebra.upcycle.student import plan_student

    plan = plan_student(teacher.shape, kwargs["options"])
    config = ZebraConfig(**plan.config, kernel_backend="torch")
    moments = None
    if kwargs.get("calibration") is not None:
        moments, _ = attention_input_moments(teacher, kwargs["calibration"], plan.mla_layers)
    source = UpcycledSource(teacher, config, torch.float32, 0, moments)
    record = {}
    if kwargs.get("calibrate") is not None:
        calibrated = calibrate_student(teacher, config, source, kwargs["calibrate"], progress_printer())
        source, record = (
            CalibratedSource(source, calibrated),
            {"layers": [vars(f) for f in calibrated.layers]},
        )
    with torch.device("meta"):
        model = ZebraForCausalLM(config)
    model.load_state_dict({n: source.get(n) for n in source.shapes()}, strict=False, assign=True)
    model.tie_weights()
    return model.eval(), type("Report", (), {"calibration": record})()


def progress_printer():
    """A calibration progress callback printing one line per layer fitted (the script runs unattended)."""
    start = time.time()

    def show(done, total, note):
        if total and done % 100 == 0:
            print(f"  {done}/{total} steps, {time.time() - start:.0f} s: {note}", flush=True)

    return show


def main() -> None:
    import torch

    from zebra.eval.ce import heldout_ce
    from zebra.models import ZebraForCausalLM
    from zebra.upcycle import open_teacher
    from zebra.upcycle.run import upcycle
    from zebra.upcycle.teachers.causal_lm import build_teacher_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("teacher")
    p.add_argument("--calibration", required=True, help="prepared folder in the teacher's tokenizer")
    p.add_argument("--heldout", required=True, help="prepared folder, or a text file")
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--table", choices=("forms", "calibrate", "compose"), default="calibrate")
    p.add_argument("--mixers", default="mamba,gdn")
    p.add_argument("--mla", type=int, default=8)
    p.add_argument(
        "--placement", default="even", help="compose: even, smart, or both (even,smart): one row each"
    )
    p.add_argument("--smart-samples", type=int, default=16, help="compose: SMART's sequences of 256 tokens")
    p.add_argument("--steps", type=int, default=50, help="calibrate: Adam steps per layer")
    p.add_argument("--samples", type=int, default=16, help="calibrate: sequences")
    p.add_argument("--eval-every", type=int, default=25, help="calibrate: steps between error measurements")
    p.add_argument("--calibrate-seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3, help="calibrate: Adam LR of the fit")
    p.add_argument("--fit-batch", type=int, default=2, help="calibrate: sequences per fit step")
    p.add_argument(
        "--schedule", default="constant", choices=("constant", "cosine"), help="calibrate: LR schedule"
    )
    p.add_argument(
        "--output-lstsq", action="store_true", help="calibrate: least-squares output projection first"
    )
    p.add_argument(
        "--keep-init",
        dest="pass_through",
        action="store_false",
        help="calibrate: the mixers' own short convs and output gates (default: identity convs, steady gates)",
    )
    p.add_argument(
        "--teacher-forced",
        dest="sequential",
        action="store_false",
        default=False,
        help="calibrate: every layer on the teacher's input (the default, as zebra upcycle's)",
    )
    p.add_argument(
        "--sequential", action="store_true", help="calibrate: every layer on the student's own stream"
    )
    p.add_argument(
        "--correct-residual", type=float, default=1.0, help="calibrate: sequential target correction"
    )
    p.add_argument("--calibrated-only", action="store_true", help="calibrate: skip the uncalibrated students")
    p.add_argument("--svd-samples", type=int, default=32, help="forms: activation-SVD sequences of 512")
    p.add_argument("--full-q-rank", type=int, default=576)
    p.add_argument("--full-kv-rank", type=int, default=384)
    p.add_argument("--skip", type=int, default=0, help="start at this student of the table")
    p.add_argument(
        "--in-memory", action="store_true", help="build each student in memory instead of exporting it"
    )
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--windows", type=int, default=8)
    args = p.parse_args()
    torch.manual_seed(0)
    teacher = open_teacher(args.teacher)
    windows = heldout_windows(args.heldout, teacher.tokenizer, args.seq, args.windows)
    rows = [{"student": "teacher", "ce": heldout_ce(build_teacher_model(teacher, torch.float32), windows)}]
    print(f"teacher: {rows[0]['ce']:.3f}", flush=True)

    def add_row(label: str, model, seconds: float, calibration, **extra) -> None:
        ce = heldout_ce(model, windows)
        rows.append({"student": label, "ce": ce, "ratio": ce / rows[0]["ce"], "upcycle_s": round(seconds, 1),
                     "calibration": calibration, **extra})  # fmt: skip
        print(f"{label}: {ce:.3f} ({ce / rows[0]['ce']:.2f}x the teacher; {seconds:.0f} s)", flush=True)

    if args.table == "compose":
        fit = "sequential" if args.sequential else "teacher-forced"
        for mixer in args.mixers.split(","):
            start = time.time()
            calibration = calibrated_students(args, teacher, mixer)  # {"mla": layers, "rec": layers}
            seconds = time.time() - start
            for placement in args.placement.split(","):
                model, layers = composed_student(args, mixer, placement)
                label = f"{mixer} + {args.mla} MLA, composed ({placement}), {fit}"
                add_row(label, model, seconds, calibration, mla_layers=list(layers))
    else:
        students = forms(args) if args.table == "forms" else hybrids(args)
        for n, (label, kwargs) in enumerate(students[args.skip :], start=args.skip):
            folder = args.output / f"student-{n}"
            start = time.time()
            if args.in_memory:
                model, report = in_memory_student(teacher, kwargs)
            else:
                report = upcycle(args.teacher, folder, force=True, on_calibrate=progress_printer(), **kwargs)
                model = ZebraForCausalLM.from_pretrained(folder, dtype=torch.float32)
            add_row(label, model, time.time() - start, report.calibration.get("layers", []))
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / f"step0-{args.table}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| student | step-0 CE | / teacher | upcycle s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['student']} | {r['ce']:.3f} | {r.get('ratio', 1.0):.2f} | {r.get('upcycle_s', '')} |")


if __name__ == "__main__":
    main()
