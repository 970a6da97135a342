"""Which distillation options spend tokens best: held-out CE of one upcycled student after the same steps under each
variant (issue 40 section 3). The step, the optimiser groups, the schedule and the losses are the trainer's.

    kd              KD, forward KL at T = 1 (published)
    kd+ce           KD with the student's CE mixed in (distill.ce_weight --ce-weight)
    topk            the KL over the teacher's top --top-k tokens and a rest bucket (distill.top_k)
    groups          copied weights at --copied-scale x the LR (distill.copied_lr_scale; Taylor-Calibrate 7e-6/1e-4)
    groups+warm     the same, the new mixers alone for the first --mixer-only of the steps (distill.mixer_only_steps)
    ild+kd          ILD of every parameter on --ild-fraction of the steps, then KD (distill.stage ild)
    ildmix+kd       ILD of the new mixers alone, then KD (distill.ild_params mixers)

    python3 scripts/python-docs-data.py SmolLM2-135M-Instruct.Q4_1.gguf data/
    python3 scripts/distill-options.py TEACHER --train data/train --heldout data/heldout --output options/ \
        --variants kd,topk --steps 40 --batch 4 --seq 256     # --init HYBRID: from a calibrated student instead

Writes OUTPUT/options.json after each variant and prints a table.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# variant -> (ILD parameters or None, DistillSpec-style overrides of the KD stage)
VARIANTS = {
    "kd": (None, {}),
    "kd+ce": (None, {"ce": True}),
    "topk": (None, {"top_k": True}),
    "groups": (None, {"groups": True}),
    "groups+warm": (None, {"groups": True, "warm": True}),
    "ild+kd": ("all", {}),
    "ildmix+kd": ("mixers", {}),
}


def figure_helpers():
    spec = importlib.util.spec_from_file_location("upcycle_figure", HERE / "upcycle-figure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(
    model, loss_fn, steps: int, lr: float, args, ctx, *, offset: int, distill=None, mixers=None
) -> None:
    """`steps` TrainSteps on the training stream from step `offset` on (cosine, 1% warm-up)."""
    from zebra.recipes.schema import TrainSpec
    from zebra.train.dist import DistEnv
    from zebra.train.optim import build_optimizer, build_scheduler
    from zebra.train.step import TrainStep

    h, device = ctx["helpers"], ctx["device"]
    spec = TrainSpec(max_steps=steps, lr=lr, min_lr=lr / 10, warmup_steps=max(1, steps // 100))
    optimizer = build_optimizer(model, spec, device, mixers)
    step = TrainStep(model, optimizer, build_scheduler(optimizer, spec, distill), DistEnv(0, 0, 1, device),
                     autocast_bf16=device.type == "cuda", clip_grad=1.0, loss_fn=loss_fn)  # fmt: skip
    for n in range(steps):
        model.train()
        start = (offset + n) * args.batch * (args.seq + 1)
        result = step([h.batch_dict(h.windows(ctx["stream"], args.seq, args.batch, start=start))])
        print(f"  step {offset + n + 1}: loss {result.loss:.4f}", flush=True)


def run_variant(name: str, args, ctx) -> dict:
    import torch

    from zebra.eval.ce import heldout_ce
    from zebra.models import ZebraForCausalLM
    from zebra.recipes.schema import DistillSpec
    from zebra.train.distill import DistillLoss, DistillWeights
    from zebra.train.ild import ILDLoss
    from zebra.train.param_roles import new_mixer_sublayers
    from zebra.train.trainer import freeze_for_ild

    ild, kd = VARIANTS[name]
    started = time.perf_counter()
    model = ZebraForCausalLM.from_pretrained(ctx["student"], dtype=torch.float32).to(ctx["device"])
    mixers = new_mixer_sublayers(ctx["student"])
    ild_steps = round(args.steps * args.ild_fraction) if ild else 0
    if ild:
        freeze_for_ild(model, mixers if ild == "mixers" else None)
        layers = len(model.config.layer_pattern) // 2
        train(model, ILDLoss(ctx["teacher"], layers), ild_steps, args.ild_lr, args, ctx, offset=0)
        model.requires_grad_(True)
    weights = DistillWeights(ce_weight=args.ce_weight if kd.get("ce") else 0.0,
                             top_k=args.top_k if kd.get("top_k") else 0)  # fmt: skip
    kd_steps = args.steps - ild_steps
    distill = DistillSpec(copied_lr_scale=args.copied_scale if kd.get("groups") else 1.0,
                          mixer_only_steps=round(kd_steps * args.mixer_only) if kd.get("warm") else 0)  # fmt: skip
    grouped = distill.copied_lr_scale != 1.0 or distill.mixer_only_steps > 0
    train(model, DistillLoss(ctx["teacher"], weights), kd_steps, args.kd_lr, args, ctx, offset=ild_steps,
          distill=distill, mixers=mixers if grouped else None)  # fmt: skip
    ce = heldout_ce(model, ctx["heldout"], ctx["device"], ctx["device"].type == "cuda")
    seconds = time.perf_counter() - started
    print(f"{name}: held-out CE {ce:.4f} ({seconds:.0f} s)", flush=True)
    return {"variant": name, "heldout_ce": ce, "ild_steps": ild_steps, "kd_steps": kd_steps, "seconds": seconds,
            "tokens": args.steps * args.batch * args.seq}  # fmt: skip


def main() -> None:
    import torch

    from zebra.core.atomic import write_atomic
    from zebra.eval.ce import heldout_ce
    from zebra.models import ZebraForCausalLM
    from zebra.upcycle import StudentOptions, upcycle

    helpers = figure_helpers()
    p = helpers.figure_parser(__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument(
        "--init", type=Path, help="start every variant from this export (a calibrated hybrid, say)"
    )
    p.add_argument("--mixer", default="gdn", help="the student zebra upcycle makes (without --init)")
    p.add_argument("--mla", type=int, default=1)
    p.add_argument("--steps", type=int, default=40, help="steps of every variant (ILD + KD)")
    p.add_argument("--kd-lr", type=float, default=1e-3)
    p.add_argument("--ild-lr", type=float, default=1e-3)
    p.add_argument("--ild-fraction", type=float, default=0.2)
    p.add_argument("--ce-weight", type=float, default=0.5)
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--copied-scale", type=float, default=0.07)
    p.add_argument("--mixer-only", type=float, default=0.2, help="share of the KD steps for the mixers alone")
    args = p.parse_args()
    names = args.variants.split(",")
    if unknown := sorted(set(names) - set(VARIANTS)):
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    args.output.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    torch.manual_seed(0)
    student = args.init or args.output / "student"
    if args.init is None:
        upcycle(
            args.teacher, student, StudentOptions(mixer=args.mixer, mla=args.mla), dtype="fp32", force=True
        )
    heldout, teacher = helpers.open_inputs(args, device)
    ctx = {"helpers": helpers, "device": device, "teacher": teacher, "heldout": heldout, "student": student,
           "stream": helpers.token_stream(args.train)}  # fmt: skip
    bf16 = device.type == "cuda"
    start = ZebraForCausalLM.from_pretrained(student, dtype=torch.float32).to(device)
    result = {"teacher_ce": heldout_ce(teacher, heldout, device, bf16), "student": str(student),
              "start_ce": heldout_ce(start, heldout, device, bf16),
              **helpers.run_facts(args, device, heldout), "variants": []}  # fmt: skip
    del start
    print(
        f"teacher: held-out CE {result['teacher_ce']:.4f}; the student before training {result['start_ce']:.4f}",
        flush=True,
    )
    for name in names:
        result["variants"].append(run_variant(name, args, ctx))
        write_atomic(args.output / "options.json", json.dumps(result, indent=2) + "\n")
    t = result["teacher_ce"]
    print(f"{'variant':<12} {'tokens':>9} {'CE':>8} {'/teacher':>8}")
    for v in result["variants"]:
        print(f"{v['variant']:<12} {v['tokens']:>9,} {v['heldout_ce']:>8.4f} {v['heldout_ce'] / t:>8.3f}")


if __name__ == "__main__":
    main()
