"""The pipeline figure (issue 14): held-out CE at equal total tokens of three ways to make a hybrid from a teacher.

    A  upcycle (--mla N, even placement) + KD                         KD on every token of the budget
    B  upcycle + ILD + KD      ILD of the all-MLA and the all-recurrent student (--ild-fraction of the tokens,
                               split between them), composed with even placement, then KD on the rest
    C  upcycle + ILD + SMART + KD   the same ILD students, composed with SMART placement (scores on --calibration
                               sequences of the training data; these forwards are not counted as tokens), KD on the rest

Reports each pipeline's held-out CE curve (tokens counted from the first ILD/KD step), its final CE against the
teacher's, its KV cache as % of the teacher's, its MLA layers and SMART's per-layer scores. Writes OUT/pipeline.json
and OUT/pipeline.png and prints a table. The step, loss and held-out CE are the trainer's and upcycle-figure.py's.

    python3 scripts/python-docs-data.py SmolLM2-135M-Instruct.Q4_1.gguf data/   # once, on any CPU machine
    python3 scripts/pipeline-figure.py SmolLM2-135M-Instruct.Q4_1.gguf --train data/train \
        --heldout data/heldout --output pipeline/                           # about 16 minutes on one H200

Defaults: 192 steps of 8 x 1024 tokens (1.6M tokens per pipeline), ILD 20% of them (10% per student), Mamba2,
6 MLA layers. `--pipelines kd` and then `--pipelines ild,smart` split the run over two GPU calls (409 s and 571 s on an
H200 with a cold Triton cache, 2026-12-03); merge the two pipeline.json by hand. On a CPU pass tiny numbers, as
tests/train/test_pipeline_figure.py does.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figure_helpers():
    """scripts/upcycle-figure.py as a module (its token stream, windows, batches and held-out CE)."""
    spec = importlib.util.spec_from_file_location("upcycle_figure", HERE / "upcycle-figure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_stage(
    model, loss_fn, steps: int, lr: float, args, ctx, *, offset: int, measure: bool
) -> list[dict]:
    """`steps` TrainSteps (AdamW, warm-up + cosine) on the stream from step `offset` of the pipeline; with `measure`,
    held-out CE points [{tokens, heldout_ce}] midway and at the end, tokens counted from the pipeline's start."""
    from zebra.eval.ce import heldout_ce
    from zebra.recipes.schema import TrainSpec
    from zebra.train.dist import DistEnv
    from zebra.train.optim import build_optimizer, build_scheduler
    from zebra.train.step import TrainStep

    h, device = ctx["helpers"], ctx["device"]
    bf16 = device.type == "cuda"
    spec = TrainSpec(max_steps=max(1, steps), lr=lr, min_lr=lr / 10, warmup_steps=max(1, steps // 100))
    optimizer = build_optimizer(model, spec, device)
    step = TrainStep(model, optimizer, build_scheduler(optimizer, spec), DistEnv(0, 0, 1, device),
                     autocast_bf16=bf16, clip_grad=1.0, loss_fn=loss_fn)  # fmt: skip
    points = []
    for n in range(1, steps + 1):
        model.train()
        start = (offset + n - 1) * args.batch * (args.seq + 1)
        step([h.batch_dict(h.windows(ctx["stream"], args.seq, args.batch, start=start))])
        if measure and n in (steps // 2, steps):
            tokens = (offset + n) * args.batch * args.seq
            points.append({"tokens": tokens, "heldout_ce": heldout_ce(model, ctx["heldout"], device, bf16)})
            print(f"  {tokens:,} tokens: held-out CE {points[-1]['heldout_ce']:.4f}", flush=True)
    return points


def ild_student(which: str, args, ctx, steps: int, offset: int) -> Path:
    """Upcycle the all-MLA (`mla`) or all-recurrent (`rec`) student, ILD it for `steps`, export it with its
    upcycle.json; returns the export folder."""
    import torch

    from zebra.convert.hf_export import export_hf
    from zebra.models import ZebraForCausalLM
    from zebra.train.ild import ILDLoss
    from zebra.train.trainer import freeze_for_ild
    from zebra.upcycle import StudentOptions, upcycle

    init = args.output / f"upcycled-{which}"
    options = StudentOptions(mixer=args.mixer, **({"mla_layers": "all"} if which == "mla" else {"mla": 0}))
    report = upcycle(args.teacher, init, options, dtype="fp32", force=True,
                     calibration=ctx["helpers"].svd_calibration(args))  # fmt: skip
    print(f"ILD of the all-{which} student ({report.pattern[:8]}...), {steps} steps", flush=True)
    model = ZebraForCausalLM.from_pretrained(init, dtype=torch.float32).to(ctx["device"])
    freeze_for_ild(model)
    loss = ILDLoss(ctx["teacher"], len(report.pattern) // 2, args.ild_norm)
    train_stage(model, loss, steps, args.ild_lr, args, ctx, offset=offset, measure=False)
    out = args.output / f"ild-{which}"
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    export_hf(state, model.config, out, tokenizer="none", force=True, source=f"ILD of {init}",
              add_files=lambda tmp: shutil.copyfile(init / "upcycle.json", tmp / "upcycle.json"))  # fmt: skip
    return out


def kd_pipeline(name: str, init: Path, report, args, ctx, steps: int, offset: int) -> dict:
    """KD of the hybrid export `init` for `steps`; the pipeline's record."""
    import torch

    from zebra.eval.ce import heldout_ce
    from zebra.models import ZebraForCausalLM
    from zebra.train.distill import DistillLoss, DistillWeights

    print(f"{name}: KD of {report.pattern} for {steps} steps", flush=True)
    model = ZebraForCausalLM.from_pretrained(init, dtype=torch.float32).to(ctx["device"])
    bf16 = ctx["device"].type == "cuda"
    at_start = {"tokens": offset * args.batch * args.seq,
                "heldout_ce": heldout_ce(model, ctx["heldout"], ctx["device"], bf16)}  # fmt: skip
    loss = DistillLoss(ctx["teacher"], DistillWeights())
    curve = [at_start, *train_stage(model, loss, steps, args.kd_lr, args, ctx, offset=offset, measure=True)]
    return {
        "pipeline": name,
        "pattern": report.pattern,
        "mla_layers": list(report.mla_layers),
        "placement": report.placement or "even",
        "kv_cache_percent": 100 * report.kv_cache_fraction,
        "curve": curve,
        "heldout_ce": curve[-1]["heldout_ce"],
        "tokens": curve[-1]["tokens"],
    }


PIPELINES = {
    "kd": ("upcycle+KD", None),
    "ild": ("upcycle+ILD+KD", "even"),
    "smart": ("upcycle+ILD+SMART+KD", "smart"),
}


def run(args, ctx, done) -> list[dict]:
    """The pipelines of `args.pipelines` (`kd`, `ild`, `smart`) at the same total steps; `done(results)` after each
    one. `ild` and `smart` share the two ILD students, so a GPU call too short for all three can run `kd` alone and
    then `ild,smart`."""
    from zebra.upcycle import StudentOptions, upcycle
    from zebra.upcycle.compose import compose

    ild_steps = max(1, round(args.steps * args.ild_fraction / 2))  # per student
    kd_steps = args.steps - 2 * ild_steps
    results = []
    if "kd" in args.pipelines:
        plain = args.output / "upcycled-hybrid"
        report = upcycle(args.teacher, plain, StudentOptions(mixer=args.mixer, mla=args.mla), dtype="fp32",
                         force=True, calibration=ctx["helpers"].svd_calibration(args))  # fmt: skip
        results.append(kd_pipeline(PIPELINES["kd"][0], plain, report, args, ctx, args.steps, 0))
        done(results)
    composed_pipelines = [PIPELINES[key] for key in ("ild", "smart") if key in args.pipelines]
    if not composed_pipelines:
        return results
    mla = ild_student("mla", args, ctx, ild_steps, 0)
    rec = ild_student("rec", args, ctx, ild_steps, ild_steps)
    for name, placement in composed_pipelines:
        out = args.output / f"composed-{placement}"
        composed = compose(mla, rec, out, mla=args.mla, placement=placement, calibration=args.train,
                           samples=args.calibration, seq_len=args.seq, device=str(ctx["device"]), force=True)  # fmt: skip
        if placement == "smart":
            ctx["smart"] = composed.smart
        results.append(kd_pipeline(name, out, composed, args, ctx, kd_steps, 2 * ild_steps))
        done(results)
    return results


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smart = result["smart"]
    if smart:
        fig, (ax, bars) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=120, gridspec_kw={"width_ratios": [3, 2]})
    else:  # no SMART pipeline in this run: the curves alone
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.axhline(result["teacher"]["heldout_ce"], color="black", linestyle=":", label="teacher")
    for i, p in enumerate(result["pipelines"]):
        points = [(q["tokens"] / 1e6, q["heldout_ce"]) for q in p["curve"]]
        ax.plot(*zip(*points, strict=True), "-o", color=f"C{i}", markersize=4,
                label=f"{p['pipeline']} (KV {p['kv_cache_percent']:.1f}%)")  # fmt: skip
    ax.set_xlabel("training tokens (M), ILD + KD")
    ax.set_ylabel("held-out CE (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    if smart:
        chosen = set(smart["selected"])
        bars.bar(range(len(smart["scores"])), smart["scores"],
                 color=["tab:orange" if i in chosen else "tab:blue" for i in range(len(smart["scores"]))])  # fmt: skip
        bars.set_xlabel("layer (orange: MLA by SMART)")
        bars.set_ylabel("KL lowered")
        bars.set_title("SMART scores")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def table(result: dict) -> str:
    t = result["teacher"]["heldout_ce"]
    lines = [f"teacher: held-out CE {t:.4f}",
             f"{'pipeline':<22} {'tokens':>10} {'CE':>8} {'CE/teacher':>10} {'KV %':>6}  MLA layers"]  # fmt: skip
    for p in result["pipelines"]:
        lines.append(f"{p['pipeline']:<22} {p['tokens']:>10,} {p['heldout_ce']:>8.4f} {p['heldout_ce'] / t:>10.3f} "
                     f"{p['kv_cache_percent']:>6.2f}  {p['mla_layers']}")  # fmt: skip
    if result["smart"]:
        scores = result["smart"]["scores"]
        lines.append("SMART scores: " + " ".join(f"{i}:{s:+.4f}" for i, s in enumerate(scores)))
    return "\n".join(lines)


def main() -> None:
    import torch

    from zebra.eval.ce import heldout_ce

    helpers = figure_helpers()
    p = helpers.figure_parser(__doc__.splitlines()[0])
    p.add_argument("--mixer", default="mamba")
    p.add_argument("--mla", type=int, default=6)
    p.add_argument("--steps", type=int, default=192, help="total steps of every pipeline (ILD + KD)")
    p.add_argument(
        "--ild-fraction", type=float, default=0.2, help="share of the steps for ILD (both students)"
    )
    p.add_argument("--kd-lr", type=float, default=2e-4)
    p.add_argument("--ild-lr", type=float, default=5e-4)
    p.add_argument("--ild-norm", default="l2", choices=("l2", "mse"))
    p.add_argument(
        "--calibration", type=int, default=64, help="SMART's calibration sequences of --seq tokens"
    )
    p.add_argument(
        "--pipelines",
        default="kd,ild,smart",
        help="which pipelines: kd (upcycle+KD), ild (+ILD), smart (+ILD+SMART)",
    )
    args = p.parse_args()
    args.pipelines = args.pipelines.split(",")
    if unknown := sorted(set(args.pipelines) - set(PIPELINES)):
        p.error(f"--pipelines: unknown {', '.join(unknown)}; choose from kd, ild, smart")
    args.output.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    heldout, teacher = helpers.open_inputs(args, device)
    ctx = {"helpers": helpers, "device": device, "teacher": teacher, "heldout": heldout,
           "stream": helpers.token_stream(args.train)}  # fmt: skip
    teacher_ce = heldout_ce(teacher, heldout, device, device.type == "cuda")
    print(f"teacher: held-out CE {teacher_ce:.4f}", flush=True)
    result = {
        "teacher": {"path": str(args.teacher), "heldout_ce": teacher_ce},
        **helpers.run_facts(args, device, heldout),
        "pipelines": [],
    }

    def save(pipelines: list[dict]) -> None:  # after every pipeline: a run cut short keeps what it finished
        from zebra.core.atomic import write_atomic

        result.update(pipelines=pipelines, smart=ctx.get("smart"))
        write_atomic(args.output / "pipeline.json", json.dumps(result, indent=2) + "\n")
        plot(result, args.output / "pipeline.png")

    run(args, ctx, save)
    print(table(result))
    print(f"wrote {args.output / 'pipeline.json'} and {args.output / 'pipeline.png'}")


if __name__ == "__main__":
    main()
