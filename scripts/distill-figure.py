"""Issue 40's section 6 figure: `zebra distill` (upcycle + calibration [+ ILD] + SMART + KD) against scratch.

For each --mixers student (Mamba2 + --mla MLA, GDN + --mla MLA) of the teacher, on a folder made by
scripts/pack-corpus.py (train documents, then the corpus's held-out documents; its pack.json says how many):

- the teacher's held-out CE and its forward cost (tokens/s, FLOP/token, MFU of a bf16 forward);
- the pipeline of `zebra distill` (`zebra.train.pipeline.run_pipeline`, OUT/distill-MIXER/) with --tokens, every
  training stage validating on exactly the held-out documents (`data.split` = the pack's document counts);
- the step-0 held-out CE after upcycle + calibration: the pipeline's two calibrated students composed with --mla MLA
  layers placed evenly, before any training (`zebra upcycle --mla N --calibrate` calibrates the hybrid on its own
  stream instead: scripts/upcycle-step0.py measures that one), and the held-out CE of KD's start, the hybrid as the
  pipeline composed it (MLA placed by SMART; after ILD with --ild-fraction above 0, else also before any training);
- a scratch student of the hybrid's shape, random init, trained with CE on the same data, tokens and batch;
- tokens/s and MFU of every training stage (the trainer's metrics.jsonl);
- `zebra eval` (lm-eval) of the teacher, each distilled student and the scratch student on a multiple-choice task
  built from the held-out documents (pick the true 24-token continuation of 96 tokens among 4; zebra bundles no
  multiple-choice data set that works offline), and each one's retention: its accuracy / the teacher's.

OUT/figure.json holds everything so far (rewritten atomically), OUT/figure.png the held-out CE over the teacher's on
the same windows against tokens (each pipeline's stages one after another, scratch, the 1.2x and 1.08x targets).
RESUMES: run the same command again; done parts are skipped, a training stage resumes from its newest checkpoint.
--deadline-seconds stops cleanly: a stage that cannot finish in the time left is not started, a training stage is
stopped (SIGTERM: the trainer saves a checkpoint) at the deadline, and the script says "run the same command again
to continue" and exits 3 (0 once the figure is complete).

GPU sequence (one H100/H200). A call runs at most 10 minutes and carries at most 64 MiB with the checkout (about
4 MB); the machine stays warm about 30 s between calls, and what is not git-ignored in the tree there is gone at
the next call, so everything lives under /tmp there. In the lead's checkout, with `.carry/` and `.gpuwheels/` in
.git/info/exclude and .gpuwheels/base/ holding the wheels of shared/gpu/setup.sh (megatron-core, lm-eval, gguf, FLA):

    # the wheels: FLA, megatron-core, gguf and Triton's four parts, then lm-eval and the 22 of its and zebra's
    # dependencies the GPU image lacks (.library/device/KINDS.md lists what it has; 18 MB in all with the first)
    ../shared/gpu/prepare.sh gguf
    for p in lm-eval==0.4.13 datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 nltk==3.10.4 \
        rouge-score==0.1.2 sqlitedict==2.1.0 word2number==1.1 more-itertools==11.2.1 pytablewriter==1.2.1 \
        dataproperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 \
        chardet==6.0.0.post1 pytz==2026.6 questionary==2.1.1 prompt-toolkit==3.0.53 wcwidth==0.9.5 defusedxml==0.7.1
    do pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        -d .gpuwheels/base "$p" || pip wheel -q --no-deps -w .gpuwheels/base "$p"; done   # 3 have no wheel

    # here, once (about 10 minutes on a busy 2-core CPU): 50M train + 1M held-out tokens and the GGUF, 3 parts of 40 MiB
    python3 scripts/pack-corpus.py /work/corpus --train-tokens 50M --heldout-tokens 1M -o /tmp/pack50m \
        --archive /tmp/pack50m/parts/smol50m --include SmolLM2-135M-Instruct.Q4_1.gguf
    # call 1: carry [".gpuwheels/base", ".carry"], .carry/ holding smol50m.tar.xz.00 alone
    bash .gpuwheels/base/setup.sh && mkdir -p /tmp/zfig && cp .carry/smol50m.tar.xz.* /tmp/zfig/
    # call 2: carry [".carry"], .carry/ holding smol50m.tar.xz.01 alone
    cp .carry/smol50m.tar.xz.* /tmp/zfig/
    # call 3: carry [".carry"], .carry/ holding smol50m.tar.xz.02 alone; unpack, then the figure
    cp .carry/smol50m.tar.xz.* /tmp/zfig/ && cat /tmp/zfig/smol50m.tar.xz.* | python3 -c "import lzma, sys, tarfile; \
        tarfile.open(fileobj=lzma.open(sys.stdin.buffer), mode='r|').extractall(sys.argv[1])" /tmp/zfig && \
        rm /tmp/zfig/smol50m.tar.xz.*
    export PYTHONPATH=/tmp/site:src:kernels PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    python3 scripts/distill-figure.py /tmp/zfig/SmolLM2-135M-Instruct.Q4_1.gguf --data /tmp/zfig/data \
        --tokens 10M --output /tmp/zfig/fig10m --deadline-seconds 540; cp /tmp/zfig/fig10m/figure.* $OUT/
    # every later call, carry []: the last two lines again until "figure complete" (exit 0; 3: not yet),
    # then --tokens 50M --output /tmp/zfig/fig50m likewise. A machine that went back starts bare: calls 1-3 again.
    # Side by side (the student is small: one run leaves most of an H100 idle), each in the background with its
    # own --output and log, then `wait`: the pipeline with --scratch none, its twin with --mixers none --scratch
    # mamba2 --shape-from OTHER/distill-mamba2/step0-hybrid, a variant with --kd-lr ... (--upcycled-from the first's
    # output once its students are calibrated: they are taken, not calibrated again); once all are complete, the
    # pipeline's command again with --include TWIN_OUT --include VARIANT_OUT=LABEL draws them in one figure.png.

Without Triton 3.7.1 on the machine (FLA's backward is refused on Hopper below it), every mixer runs Zebra's torch
kernels: on 2026-12-07 the all-Mamba2 ILD trained at 41k tokens/s against the all-MLA one's 123k, and KD at 42k.
Carry the four Triton parts of shared/gpu/prepare.sh first (one call each, `mkdir -p /tmp/gw && cp
.gpuwheels/parts/triton.0N /tmp/gw/`): on a warm machine a carrying call held it for about 4 s.

CPU, tiny (tests/train/test_distill_figure.py runs this through the smollm2_gguf fixture):

    python3 scripts/pack-corpus.py /work/corpus --train-tokens 300k --heldout-tokens 100k -o /tmp/pk
    python3 scripts/distill-figure.py SmolLM2-135M-Instruct.Q4_1.gguf --data /tmp/pk/data --tokens 8k \\
        --seq-len 64 --batch 2 --mixers mamba2 --calibrate-samples 2 --calibrate-seq-len 32 --calibrate-steps 2 \\
        --smart-samples 2 --eval-examples 8 --heldout-windows 2 --device cpu --output /tmp/fig
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

FINISHED = 0
UNFINISHED = 3  # exit code: run the same command again
# least seconds left to start one (an eval took about 13 s on an H100)
RESERVE_S = {"upcycle": 300, "compose": 90, "train": 45, "eval": 60, "step0": 60}


class Stop(Exception):
    """The deadline is near: save and exit."""


class Deadline:
    """Seconds left of --deadline-seconds; at the deadline a SIGTERM to this process stops a training stage (the
    trainer saves a checkpoint); outside one it only marks the run as stopping."""

    def __init__(self, seconds: float | None):
        self.end = None if seconds is None else time.monotonic() + seconds
        self.stopping = False
        signal.signal(signal.SIGTERM, self._on_term)
        if self.end is not None:
            timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGTERM))
            timer.daemon = True
            timer.start()

    def _on_term(self, signum, frame) -> None:
        self.stopping = True

    def need(self, kind: str) -> None:
        """Raise Stop unless a piece of work of `kind` can start."""
        left = float("inf") if self.end is None else self.end - time.monotonic()
        if self.stopping or left < RESERVE_S[kind]:
            raise Stop(f"{left:.0f} s left, {kind} needs {RESERVE_S[kind]} s")


def pipeline_view(deadline: Deadline):
    from zebra.train.pipeline import PipelineView

    class DeadlineView(PipelineView):
        def stage_started(self, index, total, stage, steps) -> None:
            deadline.need(stage.kind)  # before stages.json marks it running: a clean stop
            print(
                f"[{time.strftime('%H:%M:%S')}] stage {index}/{total}: {stage.name} {steps} steps", flush=True
            )

        def stage_done(self, stage, result) -> None:
            ce = result.get("heldout_ce")
            print(f"  {stage.name} done" + (f": held-out CE {ce:.4f}" if ce is not None else ""), flush=True)

    return DeadlineView()


def pack_info(data: Path) -> dict:
    path = data / "pack.json"
    if not path.is_file():
        raise SystemExit(f"--data {data}: no pack.json (make the folder with scripts/pack-corpus.py)")
    return json.loads(path.read_text())


def heldout_windows(data: Path, pack: dict, seq: int, count: int):
    """`[count, seq + 1]` windows from the start of the pack's held-out documents (after its train documents)."""
    import numpy as np
    import torch

    from zebra.data.indexed import open_dataset

    dataset = open_dataset(str(data / "data_00000"))
    first = pack["train_documents"]
    stream = np.concatenate([np.asarray(dataset[i], dtype=np.int64)
                             for i in range(first, first + pack["heldout_documents"])])  # fmt: skip
    if len(stream) < count * (seq + 1):
        raise SystemExit(f"{data}: {len(stream):,} held-out tokens, fewer than {count} x {seq + 1}")
    return torch.from_numpy(stream[: count * (seq + 1)]).view(count, seq + 1)


def teacher_part(args, windows, device) -> dict:
    """The teacher's held-out CE, its bf16 forward cost at --micro-batch x --seq-len, and an HF folder of it
    (for `zebra eval`)."""
    import torch

    from zebra.eval.ce import heldout_ce
    from zebra.train.metrics import device_peak_flops
    from zebra.upcycle import open_teacher
    from zebra.upcycle.teachers.causal_lm import build_teacher_model

    teacher = open_teacher(args.teacher)
    model = build_teacher_model(teacher, torch.float32).to(device)
    ce = heldout_ce(model, windows, device, device.type == "cuda")
    folder = args.output / "teacher-hf"
    model.save_pretrained(folder)
    teacher.tokenizer.save_pretrained(folder)
    ids = torch.randint(0, teacher.shape.vocab_size, (args.micro_batch, args.seq_len), device=device)
    repeats = 5 if device.type == "cuda" else 1
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        model(input_ids=ids, use_cache=False)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            model(input_ids=ids, use_cache=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / repeats
    params = sum(p.numel() for p in model.parameters())
    s = teacher.shape
    flops = 2 * params + 2 * s.num_layers * args.seq_len * s.num_heads * s.head_dim  # causal QK^T + AV
    tokens_per_s = ids.numel() / seconds
    peak = device_peak_flops(device)
    return {"path": str(args.teacher), "heldout_ce": ce, "hf_folder": str(folder), "params": params,
            "forward_tokens_per_s": tokens_per_s, "forward_flops_per_token": flops,
            "forward_mfu": flops * tokens_per_s / peak if peak else None}  # fmt: skip


def pipeline_options(args, mixer: str, pack: dict):
    from zebra.train.pipeline import PipelineOptions

    return PipelineOptions(
        teacher=str(args.teacher), data=str(args.data), tokens=args.tokens,
        output=str(args.output / f"distill-{mixer}"), mixer=mixer, mla=args.mla, seq_len=args.seq_len,
        batch=args.batch, micro_batch=args.micro_batch, ild_fraction=args.ild_fraction, ild_lr=args.ild_lr,
        kd_lr=args.kd_lr, evals=args.evals,
        smart_samples=args.smart_samples, device=args.device, calibrate_samples=args.calibrate_samples,
        calibrate_seq_len=args.calibrate_seq_len, calibrate_steps=args.calibrate_steps,
        calibrate_batch=min(args.calibrate_batch, args.calibrate_samples),
        calibrate_teacher_forced=args.calibrate_teacher_forced, calibrate_workers=args.calibrate_workers, sets=(f"data.split={pack['split']}", "train.log_interval=1"),
        upcycled_from=str(args.upcycled_from / f"distill-{mixer}") if args.upcycled_from else None,
    )  # fmt: skip


def run_metrics(run: Path) -> dict:
    """The held-out curve (step, val_loss, teacher_val_loss) and mean tokens/s and MFU of a training run folder."""
    from zebra.train.metrics import read_metrics

    records = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    rates = [r for r in records if r.get("tokens_per_s")][
        1:
    ]  # the first interval holds the compile / warm-up
    mfus = [r["mfu"] for r in rates if r.get("mfu") is not None]
    return {
        "curve": [{"step": r["step"], "heldout_ce": r["val_loss"], "teacher": r.get("teacher_val_loss")}
                  for r in records if "val_loss" in r],
        "tokens_per_s": sum(r["tokens_per_s"] for r in rates) / len(rates) if rates else None,
        "mfu": sum(mfus) / len(mfus) if mfus else None,
    }  # fmt: skip


def student_part(args, mixer: str, pack: dict, record: dict, deadline: Deadline, ctx: dict) -> None:
    """The pipeline of one mixer (resumed), then its step-0 CE; `record` is updated in place."""
    from zebra.train.pipeline import plan_stages, run_pipeline, stage_steps

    options = pipeline_options(args, mixer, pack)
    entry = record.setdefault(mixer, {})
    try:
        result = run_pipeline(options, pipeline_view(deadline))
    finally:
        stages = {}
        for stage in plan_stages(options):
            folder = Path(options.output) / stage.name
            stages[stage.name] = {"steps": stage_steps(options, stage), "kind": stage.kind}
            if stage.kind == "train":
                stages[stage.name].update(run_metrics(folder))
        entry["stages"] = stages
        entry["tokens_per_step"] = options.batch * options.seq_len
    entry["pipeline"] = result.stages
    if result.stopped_by is None:
        entry["export"] = str(result.student)
        entry["heldout_ce"] = export_ce(result.student, ctx)
    if "kd_start_ce" not in entry and result.stages.get("hybrid", {}).get("status") == "done":
        # KD's init: the hybrid as the pipeline composed it (SMART), step 0 without ILD
        deadline.need("step0")
        entry["kd_start_ce"] = export_ce(Path(options.output) / "hybrid", ctx)
        print(f"  held-out CE of KD's start (the composed hybrid): {entry['kd_start_ce']:.4f}", flush=True)
    if "step0_ce" not in entry:
        deadline.need("step0")
        entry.update(step0(args, options, ctx))
    if result.stopped_by is not None:
        raise Stop(f"{mixer}: stopped by {result.stopped_by}")


def export_ce(folder, ctx) -> float:
    """The held-out CE of a Zebra export on the script's windows (bf16 autocast on a GPU)."""
    from zebra.eval.ce import heldout_ce

    device = ctx["device"]
    return heldout_ce(load_export(folder, device), ctx["windows"], device, device.type == "cuda")


def load_export(folder, device):
    import torch

    from zebra.models import ZebraForCausalLM

    return ZebraForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)


def step0(args, options, ctx) -> dict:
    """The two calibrated students of the pipeline composed with --mla MLA layers placed evenly (each layer as its
    all-MLA or all-recurrent student calibrated it), before any training; its held-out CE."""
    from zebra.upcycle.compose import compose

    out = Path(options.output) / "step0-hybrid"
    report = compose(Path(options.output) / "upcycle-mla", Path(options.output) / "upcycle-rec", out,
                     mla=options.mla, placement="even", force=True)  # fmt: skip
    ce = export_ce(out, ctx)
    print(f"  step-0 held-out CE after upcycle + calibration: {ce:.4f}", flush=True)
    return {"step0_ce": ce, "step0_export": str(out), "step0_pattern": report.pattern}


def scratch_part(args, mixer: str, pack: dict, record: dict, deadline: Deadline, ctx: dict) -> None:
    """The hybrid's shape (the step-0 export's config), random init, CE on the pipeline's data, tokens and
    batch; resumed from its newest checkpoint."""
    from zebra.recipes import load_recipe
    from zebra.recipes.schema import ModelSpec
    from zebra.train.pipeline import plan_stages, stage_steps
    from zebra.train.run import RankLayout, prepare_run, resolve_run
    from zebra.train.trainer import train_rank

    options = pipeline_options(args, mixer, pack)
    steps = sum(stage_steps(options, s) for s in plan_stages(options) if s.kind == "train")
    shape = hybrid_shape(args, mixer, record)
    config = json.loads((shape / "config.json").read_text())
    deadline.need("train")
    lr, interval = args.scratch_lr, max(1, steps // args.evals)
    recipe = load_recipe("tiny", overrides={
        **ModelSpec.overrides_from_config(config), "data.paths": [str(args.data)], "data.mock": False,
        "data.tokenizer": str(shape), "data.seq_len": args.seq_len,
        "data.split": pack["split"], "train.global_batch_size": args.batch,
        "train.micro_batch_size": args.micro_batch, "train.max_steps": steps, "train.lr": lr,
        "train.min_lr": lr / 10, "train.warmup_steps": max(1, steps // 100), "train.lr_decay_style": "cosine",
        "train.eval_interval": interval, "train.save_interval": interval, "train.export": True,
        "train.log_interval": 1, "train.precision": "bf16" if ctx["device"].type == "cuda" else "fp32",
    })  # fmt: skip
    recipe.name = f"scratch-{mixer}"
    run = resolve_run(recipe, RankLayout(ctx["device"].type, 1, 1), output=str(args.output), run=recipe.name)
    prepare_run(run)
    print(f"[{time.strftime('%H:%M:%S')}] scratch {mixer}: {steps} steps", flush=True)
    result = train_rank(run.run_dir, resume="auto", device=str(ctx["device"]))
    entry = record.setdefault(f"scratch-{mixer}", {})
    entry.update(run_metrics(run.run_dir), steps=steps, tokens_per_step=args.batch * args.seq_len)
    if result.stopped_by is not None:
        raise Stop(f"scratch {mixer}: stopped by {result.stopped_by}")
    entry["export"] = str(run.run_dir / "export")
    entry["heldout_ce"] = export_ce(entry["export"], ctx)


def hybrid_shape(args, mixer: str, record: dict) -> Path:
    """The hybrid export whose shape (config.json) and tokenizer the scratch twin takes: --shape-from, else this
    output's step-0 hybrid."""
    found = args.shape_from or record.get(mixer, {}).get("step0_export")
    if found is None or not (Path(found) / "config.json").is_file():
        raise SystemExit(f"scratch {mixer}: no hybrid export to take its shape from ({found}); run the {mixer} "
                         f"pipeline in this --output first, or pass --shape-from a hybrid export of its shape")  # fmt: skip
    return Path(found)


def include(record: dict, others: list[str]) -> None:
    """Entries (students, scratch twins, evaluations) of other outputs' figure.json that `record` lacks: runs made
    side by side in separate processes, one figure. `DIR=LABEL` names DIR's entries "NAME (LABEL)": a variant of
    the same mixer beside this output's own."""
    for other in others:
        folder, _, label = other.partition("=")
        found = json.loads((Path(folder) / "figure.json").read_text())
        for name, entry in found.items():
            if name == "eval":
                evals = {_labelled(k, label): v for k, v in entry.items() if k != "teacher" or not label}
                record["eval"] = {**evals, **record.get("eval", {})}
            elif name != "teacher" and isinstance(entry, dict) and "heldout_ce" in entry:
                record.setdefault(_labelled(name, label), entry)


def _labelled(name: str, label: str) -> str:
    return f"{name} ({label})" if label else name


def mc_task(args, pack: dict, tokenizer) -> Path:
    """A multiple-choice task from the held-out documents: 96 tokens of a document, its next 24 tokens and 3
    spans of 24 tokens from other held-out documents; returns the folder with its YAML and JSONL."""
    import numpy as np

    from zebra.data.indexed import open_dataset

    folder = args.output / "mc-task"
    folder.mkdir(parents=True, exist_ok=True)
    dataset = open_dataset(str(args.data / "data_00000"))
    docs = [np.asarray(dataset[i]) for i in range(pack["train_documents"],
                                                  pack["train_documents"] + pack["heldout_documents"])]  # fmt: skip
    spans = [
        d[k : k + 120] for d in docs for k in range(0, len(d) - 120, 240)
    ]  # [context 96 | continuation 24]
    rng = np.random.default_rng(0)
    rows = []
    for n in rng.permutation(len(spans))[: args.eval_examples].tolist():
        others = [m for m in rng.permutation(len(spans))[:4].tolist() if m != n][:3]
        choices = [tokenizer.decode(spans[m][96:].tolist()) for m in [n, *others]]
        order = rng.permutation(4).tolist()
        rows.append({"context": tokenizer.decode(spans[n][:96].tolist()),
                     "choices": [choices[i] for i in order], "answer": order.index(0)})  # fmt: skip
    data = folder / "heldout_mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "heldout_mc.yaml").write_text(
        f"task: heldout_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data.resolve()}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\ntarget_delimiter: \"\"\nmetric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n  - metric: acc_norm\n"
        "    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n"
    )  # fmt: skip
    return folder


def eval_part(args, pack: dict, record: dict, deadline: Deadline, ctx: dict) -> None:
    """`zebra eval` (lm-eval through zebra.eval.harness) of the teacher and every finished student."""
    import importlib.util

    from zebra.eval.harness import EvalRequest, metric_rows, run_eval
    from zebra.upcycle import open_teacher

    if importlib.util.find_spec("lm_eval") is None:
        print("eval skipped: lm-eval is not installed (pip install 'zebra-llama[eval]')", flush=True)
        return

    models = {"teacher": record["teacher"]["hf_folder"]}
    models.update({name: e["export"] for name, e in record.items() if isinstance(e, dict) and "export" in e})
    evals = record.setdefault("eval", {})
    folder = None
    for name, model in models.items():
        if name in evals:
            continue
        deadline.need("eval")
        if folder is None:
            folder = mc_task(args, pack, open_teacher(args.teacher).tokenizer)
        results = run_eval(EvalRequest(model=model, tasks=["heldout_mc"], include_path=[folder],
                                       device=str(ctx["device"]), dtype="fp32"))  # fmt: skip
        evals[name] = {r["metric"]: r["value"] for r in metric_rows(results)}
        print(f"  eval {name}: {evals[name]}", flush=True)
    teacher = evals.get("teacher", {}).get("acc")
    for scores in evals.values():
        if teacher:
            scores["retention"] = scores["acc"] / teacher


def plot(record: dict, path: Path) -> None:
    """Held-out CE over the teacher's, on the same windows, against the tokens of all stages: each training stage's
    curve on the trainer's validation windows (ILD stages train one student each, so they are drawn apart from the
    hybrid's KD), the step-0 and final points on the script's windows; the teacher and the 1.2x / 1.08x targets as
    lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=120)
    for level, style, label in (
        (1.0, ":", "teacher"),
        (1.2, "--", "1.2x (10M target)"),
        (1.08, "-.", "1.08x (50M)"),
    ):
        ax.axhline(level, color="black", linestyle=style, linewidth=0.8, label=label)
    entries = [(k, v) for k, v in record.items() if isinstance(v, dict) and "tokens_per_step" in v]
    # the teacher on the trainer's windows (every training stage validates on the same ones)
    trainer_teacher = next((p["teacher"] for _, v in entries for st in (v.get("stages") or {}).values()
                            for p in st.get("curve", []) if p.get("teacher")), None)  # fmt: skip
    script_teacher = record.get("teacher", {}).get("heldout_ce")
    for i, (name, entry) in enumerate(entries):
        per_step, offset, kd_offset = entry["tokens_per_step"], 0, 0
        for stage_name, stage in (entry.get("stages") or {"scratch": entry}).items():
            kd_offset = offset if stage_name == "kd" else kd_offset
            teacher = [p.get("teacher") or trainer_teacher for p in stage.get("curve", [])]
            points = [((offset + p["step"]) * per_step / 1e6, p["heldout_ce"] / t)
                      for p, t in zip(stage.get("curve", []), teacher, strict=True) if t]  # fmt: skip
            offset += stage.get("steps", 0) if stage.get("kind", "train") == "train" else 0
            if points:
                ild = stage_name.startswith("ild")
                ax.plot(*zip(*points, strict=True), "o-" if not ild else "o:", color=f"C{i}", markersize=3,
                        alpha=0.5 if ild else 1.0, label=f"{name} {stage_name}" if stage_name != "scratch" else name)  # fmt: skip
        if script_teacher:
            ends = [(0.0, entry.get("step0_ce")), (offset * per_step / 1e6, entry.get("heldout_ce"))]
            ends = [(x, ce / script_teacher) for x, ce in ends if ce is not None]
            if ends:
                ax.plot(*zip(*ends, strict=True), "D", color=f"C{i}", markersize=6, linestyle="none")
            if entry.get("kd_start_ce") is not None:
                start = (kd_offset * per_step / 1e6, entry["kd_start_ce"] / script_teacher)
                ax.plot(*start, "s", color=f"C{i}", markersize=6, fillstyle="none")
    ax.set_xlabel("training tokens (M), all stages")
    ax.set_ylabel("held-out CE / the teacher's (same windows)")
    ax.set_title("diamonds: step 0 (MLA even) and the end, squares: KD's start (the pipeline's hybrid), on the "
                 "script's windows; lines: the trainer's", fontsize=9)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def save(args, record: dict) -> None:
    from zebra.core.atomic import write_atomic

    write_atomic(args.output / "figure.json", json.dumps(record, indent=1, default=str) + "\n")
    plot(record, args.output / "figure.png")


def parse_args():
    from zebra.cli.distill import parse_tokens

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("teacher", type=Path)
    p.add_argument("--data", type=Path, required=True, help="a folder made by scripts/pack-corpus.py")
    p.add_argument("--tokens", type=parse_tokens, default="50M", help="training tokens of each pipeline")
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--mixers", default="mamba2,gdn", help="the pipelines to run (none: only --scratch twins)")
    p.add_argument(
        "--scratch",
        default=None,
        help="mixers with a scratch twin (default: --mixers; none: no scratch run, for a variant whose "
        "twin another --output measured)",
    )
    p.add_argument(
        "--shape-from",
        type=Path,
        default=None,
        help="a hybrid export whose config.json and tokenizer the scratch twin takes (with --mixers none): another "
        "output's distill-MIXER/step0-hybrid, or the hybrid upcycled without calibration (the same config)",
    )
    p.add_argument(
        "--include",
        action="append",
        default=[],
        help="another --output whose finished students and twins join this figure; DIR=LABEL names them "
        "'NAME (LABEL)' (a variant of the same mixer); repeatable",
    )
    p.add_argument("--mla", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--ild-fraction", type=float, default=0.0, help="0: no ILD (zebra distill --ild-fraction)")
    p.add_argument("--ild-lr", type=float, default=5e-4)
    p.add_argument("--kd-lr", type=float, default=3e-4)
    p.add_argument("--scratch-lr", type=float, default=2e-3)
    p.add_argument("--evals", type=int, default=8, help="held-out evaluations (and checkpoints) per stage")
    p.add_argument("--smart-samples", type=int, default=64)
    p.add_argument("--calibrate-samples", type=int, default=128)
    p.add_argument("--calibrate-seq-len", type=int, default=512)
    p.add_argument("--calibrate-steps", type=int, default=600)
    p.add_argument(
        "--calibrate-workers",
        type=int,
        default=0,
        help="processes fitting the layers (0: zebra distill's default)",
    )
    p.add_argument(
        "--calibrate-batch", type=int, default=8, help="at most --calibrate-samples (default 8, or fewer)"
    )
    p.add_argument(
        "--calibrate-teacher-forced",
        action="store_true",
        default=True,
        help="fit each mixer on the teacher's inputs (the default, as zebra distill's)",
    )
    p.add_argument(
        "--calibrate-sequential",
        dest="calibrate_teacher_forced",
        action="store_false",
        help="fit each mixer on its own student's stream (zebra distill --calibrate-sequential)",
    )
    p.add_argument(
        "--upcycled-from",
        type=Path,
        help="another output of this script, upcycled alike: each pipeline takes its upcycle stages "
        "(zebra distill --upcycled-from) instead of calibrating again",
    )
    p.add_argument("--heldout-windows", type=int, default=32, help="windows of --seq-len for the script's CE")
    p.add_argument("--eval-examples", type=int, default=500)
    p.add_argument("--device", default="auto")
    p.add_argument("--deadline-seconds", type=float, default=None)
    p.add_argument(
        "--upcycle-reserve",
        type=float,
        default=RESERVE_S["upcycle"],
        help="seconds an upcycle stage (with its calibration) needs before the deadline to start",
    )
    args = p.parse_args()
    RESERVE_S["upcycle"] = args.upcycle_reserve
    return args


def main() -> int:
    import torch

    from zebra.core.device import resolve_device

    args = parse_args()
    deadline = Deadline(args.deadline_seconds)
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / "figure.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    pack = pack_info(args.data)
    device = torch.device(resolve_device(args.device))
    ctx = {"device": device, "windows": heldout_windows(args.data, pack, args.seq_len, args.heldout_windows)}
    mixers = [] if args.mixers == "none" else args.mixers.split(",")
    scratch = args.scratch or args.mixers
    include(record, args.include)
    try:
        if "teacher" not in record:
            record["teacher"] = teacher_part(args, ctx["windows"], device)
            print(f"teacher: held-out CE {record['teacher']['heldout_ce']:.4f}", flush=True)
            save(args, record)
        for mixer in mixers:
            if "heldout_ce" not in record.get(mixer, {}):
                student_part(args, mixer, pack, record, deadline, ctx)
                save(args, record)
        for mixer in [] if scratch == "none" else scratch.split(","):
            if "heldout_ce" not in record.get(f"scratch-{mixer}", {}):
                scratch_part(args, mixer, pack, record, deadline, ctx)
                save(args, record)
        eval_part(args, pack, record, deadline, ctx)
    except Stop as stop:
        save(args, record)
        print(f"stopped ({stop}); run the same command again to continue", flush=True)
        return UNFINISHED
    save(args, record)
    print(json.dumps({k: v.get("heldout_ce") for k, v in record.items() if isinstance(v, dict)}, indent=1))
    print(f"figure complete: {args.output / 'figure.json'}, {args.output / 'figure.png'}", flush=True)
    return FINISHED


if __name__ == "__main__":
    raise SystemExit(main())
