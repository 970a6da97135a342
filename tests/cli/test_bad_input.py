"""The bad-input suite: every command, fed families of bad input (broken, empty, binary, truncated, wrong type,
unwritable, read through a link, output inside input, a file cut short as by a kill), keeps the contract of
docs/development.md "Bad input":

- it exits with the case's status (non-zero unless the input is one zebra reads on purpose, as documented);
- stderr holds at most two lines (the error and its fix; a library's progress bar is not a line of it), which
  name the culprit (file, key or flag);
- never the catch-all ("this looks like a bug") nor a traceback: this suite fails if one is reached;
- every file that existed before is unchanged (SHA-256), and nothing new is left behind (no half-written
  output, no temporary file, no empty results folder), unless the case names what it may leave.

Most cases run in this process through Typer's CliRunner, on the same root group and catch-all a user meets
(`zebra.cli.main.app`), each in a folder of its own (the working directory for its run): torch, transformers and
lm-eval are imported once for all of them. A case runs as a real `zebra` process only where the process boundary
is the point: a closed or full stdout, a full disk (RLIMIT_FSIZE: a write past it fails with EFBIG, as one past a
full disk fails with ENOSPC), stdin's decoding of bytes that are not UTF-8; those run beside the others, in
threads. Read-only places are the parts of /sys (sysfs refuses new files to root too). The run and the export
every case copies are made once for the module: `zebra train tiny` for two steps, in this process.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.cli.conftest import ENTRY
from typer.testing import CliRunner

from zebra.cli.main import app

UNWRITABLE = "/sys/zebra-bad-input"  # sysfs: no new file or folder, even for root
# the run folder's lock file (zebra.core.locks), which stays beside a run as it does after any run; the question about
# an earlier run's results is asked with the lock held, so that a run in progress is told as one
LOCK = "runs/r/.lock"
TASKS = Path(__file__).parents[1] / "eval" / "tasks"  # lm-eval task YAMLs with local data (offline)


@dataclass(frozen=True)
class Case:
    """One bad input: `setup(folder, made)` makes it in the case's folder (`made`: the module's tiny run, whose
    `export/` is a trained model), `argv` is the command ({d}: the case's folder), `culprit`: what the output
    must name."""

    id: str
    family: str
    argv: list[str]
    culprit: str
    setup: Callable[[Path, Path], None] | None = None
    code: int | None = None  # None: any non-zero status
    env: dict[str, str] = field(default_factory=dict)
    stdin: bytes = b""
    stdout: str = "pipe"  # pipe | closed | full
    fsize: int | None = None  # RLIMIT_FSIZE bytes: a disk that fills up
    leaves: tuple[str, ...] = ()  # new paths (relative) the command may leave, e.g. a success's output
    max_lines: int = 2  # stderr lines at most
    process: bool = False  # a real process even with a piped stdout and no disk limit (stdin's decoding)

    @property
    def in_process(self) -> bool:
        return not self.process and self.stdout == "pipe" and self.fsize is None


# --- inputs ----------------------------------------------------------------------------------------------------


def write(rel: str, data: bytes | str) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return make


def append(rel: str, text: str) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        with (d / rel).open("a") as f:
            f.write(text)

    return make


def link(rel: str, target: str) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).symlink_to(d / target)

    return make


def both(*steps: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        for step in steps:
            step(d, run)

    return make


def copy_run(d: Path, run: Path) -> None:
    shutil.copytree(run, d / "runs" / "r", ignore=shutil.ignore_patterns(".lock", "data_cache"))


def copy_export(d: Path, run: Path, to: str = "model") -> None:
    shutil.copytree(run / "export", d / to)


def edit_json(rel: str, change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        data = json.loads((d / rel).read_text())
        change(data)
        (d / rel).write_text(json.dumps(data))

    return make


def edit_weights(change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        from safetensors.torch import load_file, save_file

        shard = next((d / "model").glob("*.safetensors"))
        tensors = load_file(shard)
        change(tensors)
        save_file(tensors, shard, metadata={"format": "pt"})

    return make


def _nan(tensors: dict) -> None:
    tensors[next(k for k in tensors if k.endswith("down_proj.weight"))][0, 0] = float("nan")


def _huge_norm(tensors: dict) -> None:
    """Finite weights (3e38 < float32's 3.4e38) whose logits overflow to infinities and NaN."""
    tensors["model.norm.weight"].fill_(3e38)


nan_weights = edit_weights(_nan)
overflowing_weights = edit_weights(_huge_norm)


def cut_short(rel: str, keep: float = 0.5) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        path = d / rel
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])

    return make


def wider_mlp(config: dict) -> None:
    config["intermediate_size"] *= 2


def drop_checkpoints(d: Path, run: Path) -> None:
    shutil.rmtree(d / "runs" / "r" / "checkpoints")


def bad_meta(d: Path, run: Path) -> None:
    for meta in (d / "runs" / "r" / "checkpoints").glob("step_*/meta.json"):
        meta.write_text(json.dumps({"step": "forty", "world_size": [1], "time": "noon"}))


def llama_teacher(d: Path, run: Path) -> None:
    """teacher/: a dense Llama of two small layers (random weights) with the run's tokenizer, for upcycle and
    distill to open."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.loads((run / "export" / "config.json").read_text())["vocab_size"]
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(d / "teacher")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(run / "export" / name, d / "teacher")


def eval_task(d: Path, run: Path) -> None:
    """tasks/zebra_toy_mc.yaml, and the toy_mc.jsonl its data_files names (relative to the working directory,
    the case's folder)."""
    (d / "tasks").mkdir()
    shutil.copy(TASKS / "zebra_toy_mc.yaml", d / "tasks")
    shutil.copy(TASKS / "toy_mc.jsonl", d)


JSONL = b'{"text": "a document of the corpus"}\n{"text": "another one"}\n'
GZ = gzip.compress(JSONL * 50)
STEPS = 2  # the module's run: two steps, a checkpoint at the second
# the run's settings, so that resuming it changes none
RUN_SETS = {"train.global_batch_size": 4, "train.micro_batch_size": 4, "data.seq_len": 64, "train.warmup_steps": 1,
            "train.eval_interval": STEPS, "train.save_interval": STEPS}  # fmt: skip
TINY = [arg for key, value in RUN_SETS.items() for arg in ("--set", f"{key}={value}")]
PREP = ["data", "prep", "--tokenizer", "byte", "--yes", "--workers", "1"]
EVAL = [
    "eval",
    "model",
    "--tasks",
    "zebra_toy_mc",
    "--include-path",
    "tasks",
    "--limit",
    "2",
    "--device",
    "cpu",
]
JOBS = {"ZEBRA_CACHE": "{d}/cache"}


# --- the cases -------------------------------------------------------------------------------------------------

CASES = [
    # data prep: files it reads
    Case("prep-fake-parquet", "binary", [*PREP, "--source", "c.parquet", "-o", "out"], "c.parquet",
         write("c.parquet", "not a parquet file\n")),
    Case("prep-corrupt-gzip", "broken", [*PREP, "--source", "c.jsonl.gz", "-o", "out"], "c.jsonl.gz",
         write("c.jsonl.gz", b"\x1f\x8b\x08\x00garbage")),
    Case("prep-truncated-gzip", "truncated", [*PREP, "--source", "c.jsonl.gz", "-o", "out"], "c.jsonl.gz",
         write("c.jsonl.gz", GZ[: len(GZ) // 2])),
    Case("prep-not-gzip", "wrong type", [*PREP, "--source", "c.jsonl.gz", "-o", "out"], "gzip",
         write("c.jsonl.gz", JSONL)),
    Case("prep-cut-json-array", "truncated", [*PREP, "--source", "c.json", "-o", "out"], "c.json",
         write("c.json", '[{"text": "a"}, {"text": "b')),
    Case("prep-empty-folder", "empty", [*PREP, "--source", "corpus", "-o", "out"], "--source corpus",
         write("corpus/README", "no data here")),
    Case("prep-output-inside-source", "output inside input", [*PREP, "--source", "corpus", "-o", "corpus/data"],
         "is inside --source", write("corpus/a.jsonl", JSONL)),
    Case("prep-output-is-source", "output inside input",
         [*PREP, "--source", "corpus/a.jsonl", "-o", "corpus/a.jsonl", "--force"], "is --source",
         write("corpus/a.jsonl", JSONL)),
    Case("prep-output-holds-source", "output inside input", [*PREP, "--source", "corpus/a.jsonl", "-o", "."],
         "contains --source", write("corpus/a.jsonl", JSONL)),
    Case("prep-output-is-a-file", "wrong type", [*PREP, "--source", "a.jsonl", "-o", "taken/data"], "taken",
         both(write("a.jsonl", JSONL), write("taken", "a file"))),
    Case("prep-output-unwritable", "unwritable", [*PREP, "--source", "a.jsonl", "-o", UNWRITABLE], UNWRITABLE,
         write("a.jsonl", JSONL)),
    Case("prep-disk-full", "unwritable", [*PREP, "--source", "a.jsonl", "-o", "out"], "out", write("a.jsonl", JSONL * 200),
         fsize=4096, leaves=("out",)),
    Case("prep-linked-txt", "through a symlink", [*PREP, "--source", "docs", "-o", "out"], "", code=0,
         setup=lambda d, run: (write("blob.json", '{"text": "cut')(d, run), (d / "docs").mkdir(),
                               (d / "docs" / "doc.txt").symlink_to(d / "blob.json")),
         leaves=("out",), max_lines=0),
    Case("prep-workers-huge", "wrong type", [*PREP[:-2], "--source", "a.jsonl", "--workers", "99999"], "--workers",
         write("a.jsonl", JSONL)),
    Case("inspect-manifest-not-json", "broken", ["data", "inspect", "d"], "manifest.json",
         write("d/manifest.json", "{half a manifest")),
    Case("inspect-index-junk", "binary", ["data", "inspect", "d/x"], "x.idx",
         both(write("d/x.bin", b"\x00" * 64), write("d/x.idx", b"\xde\xad\xbe\xef"))),
    Case("train-data-index-empty", "empty", ["train", "tiny", "--data", "d/x", "--dry-run"], "x.idx",
         both(write("d/x.bin", b""), write("d/x.idx", b""))),
    # recipes: numbers and files
    Case("recipe-steps-overflow", "wrong type",
         ["recipes", "show", "tiny", "--set", "train.max_steps=99999999999999999999999999999"], "train.max_steps"),
    Case("recipe-width-huge", "wrong type", ["recipes", "show", "tiny", "--set", "model.hidden_size=9999999999"],
         "model.hidden_size"),
    Case("recipe-set-not-a-number", "wrong type", ["recipes", "show", "tiny", "--set", "data.seq_len=long"],
         "--set: data.seq_len"),
    Case("recipe-not-yaml", "broken", ["recipes", "show", "r.yaml"], "r.yaml", write("r.yaml", "model: [oops\n")),
    Case("recipe-binary", "binary", ["recipes", "show", "r.yaml"], "r.yaml", write("r.yaml", b"\xff\xfe\x00\x01")),
    Case("train-dry-run-sequences", "wrong type",
         ["train", "tiny", "--mock-data", "--max-steps", "999999999", "--dry-run"], "train.max_steps"),
    Case("train-set-name-not-a-folder-name", "wrong type",
         ["train", "tiny", "--mock-data", "--set", "name=../x", "--dry-run"], "--set: name"),
    # bytes that are not UTF-8 (argv decodes them to lone surrogates): no folder named with them
    Case("train-set-name-not-utf8", "binary",
         ["train", "tiny", "--mock-data", "--set", "name=ab\udcffc", "--dry-run"], "--set: name"),
    Case("train-run-name-control", "binary", ["train", "tiny", "--mock-data", "--run", "a\nb", "--dry-run"], "--run"),
    # train: run folders and where it writes
    Case("train-results-without-checkpoint", "interrupted",
         ["train", "tiny", "--mock-data", "--output", "runs", "--run", "r", "--max-steps", "1", *TINY],
         "no checkpoint to resume", both(copy_run, drop_checkpoints), leaves=(LOCK,)),
    Case("train-config-not-yaml", "broken",
         ["train", "tiny", "--output", "runs", "--run", "r", "--max-steps", str(STEPS + 1), *TINY, "--dry-run"],
         "config.yaml", both(copy_run, write("runs/r/config.yaml", "{{{ not: [yaml"))),
    Case("train-checkpoint-meta-wrong-types", "wrong type",
         ["train", "tiny", "--output", "runs", "--run", "r", "--max-steps", str(STEPS), *TINY], "meta.json",
         both(copy_run, bad_meta), leaves=(LOCK,)),
    Case("train-output-is-a-file", "wrong type", ["train", "tiny", "--mock-data", "--output", "runs"], "runs",
         write("runs", "a file")),
    Case("train-output-unwritable", "unwritable", ["train", "tiny", "--mock-data", "--output", UNWRITABLE],
         UNWRITABLE),
    Case("cache-is-a-file", "wrong type", ["train", "tiny", "--output", "runs", "--max-steps", "1"], "ZEBRA_CACHE",
         write("cache", "a file"), env={"ZEBRA_CACHE": "{d}/cache"}),
    Case("cache-unwritable", "unwritable", ["train", "tiny", "--output", "runs", "--max-steps", "1"], "ZEBRA_CACHE",
         env={"ZEBRA_CACHE": UNWRITABLE}),
    # plot
    Case("plot-metrics-not-utf8", "binary", ["plot", "runs/r"], "runs/r",
         both(copy_run, write("runs/r/metrics.jsonl", b'\xff\xfe{"step": 1}\n\x80\n'))),
    Case("plot-output-is-its-input", "output inside input", ["plot", "runs/r", "-o", "runs/r/metrics.jsonl"],
         "metrics.jsonl", copy_run),
    Case("plot-output-not-an-image", "wrong type", ["plot", "runs/r", "-o", "curve.txt"], "curve.txt", copy_run),
    Case("plot-output-unwritable", "unwritable", ["plot", "runs/r", "-o", f"{UNWRITABLE}/loss.png"], UNWRITABLE,
         copy_run),
    # upcycle, convert, verify
    Case("upcycle-output-is-teacher", "output inside input", ["upcycle", "model", "--output", "model", "--force"],
         "is the teacher", copy_export),
    Case("upcycle-output-inside-teacher", "output inside input", ["upcycle", "model", "--output", "model/student"],
         "is inside the teacher", copy_export),
    Case("compose-output-is-a-student", "output inside input",
         ["upcycle", "--compose", "model", "model2", "--mla", "1", "--output", "model2", "--force"],
         "RECURRENT_DIR", both(copy_export, lambda d, run: shutil.copytree(d / "model", d / "model2"))),
    Case("distill-output-is-teacher", "output inside input",
         ["distill", "model", "--data", "data", "--tokens", "1M", "-o", "model"], "is the teacher", copy_export),
    Case("distill-output-holds-data", "output inside input",
         ["distill", "model", "--data", "out/data", "--tokens", "1M", "-o", "out"], "--data",
         both(copy_export, write("out/data/manifest.json", "{}"))),
    Case("upcycle-output-is-calibrate-data", "output inside input",
         ["upcycle", "model", "-o", "cal", "--calibrate", "cal", "--force"], "--calibrate",
         both(copy_export, write("cal/manifest.json", "{}"))),
    Case("upcycle-calibrate-lr-zero", "wrong type",
         ["upcycle", "model", "-o", "s", "--calibrate", "@sample", "--calibrate-lr", "0"], "--calibrate-lr",
         copy_export),
    Case("upcycle-calibrate-flag-without-calibrate", "wrong type",
         ["upcycle", "model", "-o", "s", "--calibrate-steps", "5"], "--calibrate-steps", copy_export),
    Case("distill-placement-unknown", "wrong type",
         ["distill", "model", "--data", "d", "--tokens", "1M", "-o", "out", "--placement", "random"], "--placement",
         copy_export),
    Case("distill-calibrate-schedule-unknown", "wrong type",
         ["distill", "model", "--data", "d", "--tokens", "1M", "-o", "out", "--calibrate-schedule", "step"],
         "--calibrate-schedule", copy_export),
    Case("corpus-unknown-source", "wrong type", ["data", "corpus", "-o", "c", "--sources", "novels"], "novels"),
    Case("convert-output-inside-checkpoints", "output inside input",
         ["convert", "runs/r", "--output", "runs/r/checkpoints/hf"], "is inside the source", copy_run),
    Case("verify-config-does-not-fit", "wrong type", ["verify", "model"], "do not fit",
         both(copy_export, edit_json("model/config.json", wider_mlp))),
    Case("verify-weights-cut-short", "interrupted", ["verify", "model"], "model/model.safetensors",
         both(copy_export, cut_short("model/model.safetensors"))),
    # generate, chat, eval
    Case("generate-config-does-not-fit", "wrong type", ["generate", "model", "-p", "hi", "--max-new", "2"],
         "do not fit", both(copy_export, edit_json("model/config.json", wider_mlp))),
    Case("generate-nan-weights", "broken", ["generate", "model", "-p", "hi", "--max-new", "2"], "NaN",
         both(copy_export, nan_weights)),
    Case("generate-config-not-json", "broken", ["generate", "model", "-p", "hi"], "model",
         both(copy_export, write("model/config.json", "{not json"))),
    Case("generate-prompt-not-utf8", "binary", ["generate", "model", "--file", "p.txt", "--max-new", "2"],
         "U+FFFD", both(copy_export, write("p.txt", b"caf\xe9 \xff\xfe")), code=0, max_lines=1),
    Case("chat-line-not-utf8", "binary", ["chat", "model", "--max-new", "2", "--temperature", "0"], "not UTF-8", code=0,
         setup=copy_export, stdin=b"caf\xe9 au lait\n/quit\n", max_lines=0, process=True),  # stdin as a terminal decodes it
    Case("eval-output-is-a-file", "wrong type", ["eval", "model", "--tasks", "arc_easy", "--output", "r.json"],
         "r.json", both(copy_export, write("r.json", '{"earlier": "results"}'))),
    Case("eval-output-inside-model", "output inside input", ["eval", "model", "--output", "model/results"],
         "is inside the model", copy_export),
    Case("generate-max-new-zero", "wrong type", ["generate", "model", "-p", "hi", "--max-new", "0"], "--max-new",
         code=2),  # a flag's range is Typer's: its usage error in zebra's two lines, status 2 as Click's
    Case("upcycle-seq-len-huge", "wrong type", ["upcycle", "model", "-o", "s", "--seq-len", "99999999"], "--seq-len",
         code=2),
    # stdout
    Case("stdout-closed", "unwritable", ["recipes", "list"], "stdout", stdout="closed"),
    Case("stdout-full", "unwritable", ["recipes", "list"], "stdout", stdout="full"),
    Case("stdout-full-yaml", "unwritable", ["recipes", "show", "tiny"], "stdout", stdout="full"),
    Case("generate-stdout-full", "unwritable", ["generate", "model", "-p", "hi", "--max-new", "2"], "stdout",
         copy_export, stdout="full"),
    # usage errors: a flag's type or range, an unknown option (Typer's parser; zebra's two lines, status 2)
    Case("train-gpus-not-a-number", "wrong type", ["train", "tiny", "--gpus", "abc"], "--gpus", code=2),
    Case("verify-max-new-tokens-negative", "wrong type", ["verify", "model", "--max-new-tokens", "-1"],
         "--max-new-tokens", code=2),
    Case("prep-workers-not-a-number", "wrong type", [*PREP[:-2], "--source", "a.jsonl", "--workers", "x"],
         "--workers", code=2),
    Case("eval-num-fewshot-negative", "wrong type", ["eval", "model", "--num-fewshot", "-1"], "--num-fewshot", code=2),
    Case("chat-temperature-nan", "wrong type", ["chat", "model", "--temperature", "nan"], "--temperature", code=2),
    Case("bench-decode-prompt-zero", "wrong type", ["bench", "decode", "--prompt", "0"], "--prompt", code=2),
    Case("root-unknown-option", "wrong type", ["--bogus"], "--bogus", code=2),
    Case("train-unknown-option", "wrong type", ["train", "tiny", "--max-step", "3"], "--max-step", code=2),
    # logits that are not finite from finite weights: an overflow (issue 45)
    Case("generate-logits-overflow", "broken", ["generate", "model", "-p", "hi", "--max-new", "2"], "NaN or infinite",
         both(copy_export, overflowing_weights)),
    Case("chat-logits-overflow", "broken", ["chat", "model", "--max-new", "2", "--temperature", "0"],
         "the conversation is as before it", both(copy_export, overflowing_weights), stdin=b"hello\n/quit\n", code=0),
    # ... and a failed eval leaves no results folder behind (res/deep is made when --output is checked, before
    # lm-eval starts, and removed again with its parent when the evaluation fails)
    Case("eval-logits-overflow", "broken", [*EVAL, "--output", "res/deep"], "NaN or infinite",
         both(copy_export, overflowing_weights, eval_task)),
    # weights, configs and tasks cut short or broken, for every command that loads them
    Case("generate-weights-cut-short", "truncated", ["generate", "model", "-p", "hi"], "model/model.safetensors",
         both(copy_export, cut_short("model/model.safetensors"))),
    Case("convert-weights-cut-short", "truncated", ["convert", "model", "--output", "out"], "model.safetensors",
         both(copy_export, cut_short("model/model.safetensors"))),
    Case("verify-against-cut-short", "truncated", ["verify", "model", "--against", "src"], "src/model.safetensors",
         both(copy_export, lambda d, run: copy_export(d, run, "src"), cut_short("src/model.safetensors"))),
    Case("chat-config-not-json", "broken", ["chat", "model"], "config.json",
         both(copy_export, write("model/config.json", "{not json"))),
    Case("upcycle-teacher-config-not-json", "broken", ["upcycle", "model", "-o", "s"], "config.json",
         both(copy_export, write("model/config.json", "{not json"))),
    Case("eval-task-not-yaml", "broken", [*EVAL[:-4]], "zebra_toy_mc.yaml",
         both(copy_export, write("tasks/zebra_toy_mc.yaml", "task: [oops\n"))),
    Case("distill-data-manifest-broken", "broken",
         ["distill", "teacher", "--data", "data", "--tokens", "1M", "-o", "out"], "manifest.json",
         both(llama_teacher, write("data/manifest.json", "{half"))),
    Case("distill-output-unwritable", "unwritable", ["distill", "model", "--data", "d", "--tokens", "1M", "-o",
         UNWRITABLE], UNWRITABLE, copy_export),
    Case("bench-data-corpus-binary", "binary",
         ["bench", "data", "--corpus", "c.jsonl", "--tokenizer", "byte", "--repeat", "1", "--rounds", "1"], "c.jsonl",
         write("c.jsonl", b"\xff\xfe\x00garbage\n")),
    Case("jobs-registry-not-json", "broken", ["jobs", "list"], "jobs.json", write("cache/jobs.json", "[{oops"),
         env=JOBS, leaves=("cache/jobs.lock",)),  # the registry's lock, as after any jobs command
    Case("jobs-registry-binary", "binary", ["jobs", "list"], "jobs.json", write("cache/jobs.json", b"\xff\xfe\x00"),
         env=JOBS, leaves=("cache/jobs.lock",)),
    Case("recipe-empty", "empty", ["recipes", "show", "r.yaml"], "name: r", write("r.yaml", ""), code=0,
         max_lines=0),  # read on purpose: an empty recipe is the defaults (tests/recipes/test_validation.py)
    Case("recipe-linked-to-a-folder", "through a symlink", ["recipes", "show", "r.yaml"], "r.yaml",
         both(write("folder/x", "x"), link("r.yaml", "folder"))),
    Case("plot-metrics-empty", "empty", ["plot", "runs/r"], "runs/r",
         both(copy_run, write("runs/r/metrics.jsonl", ""))),
    Case("generate-prompt-file-missing", "empty", ["generate", "model", "--file", "nope.txt"], "nope.txt",
         copy_export),
    Case("generate-prompt-file-is-a-folder", "wrong type", ["generate", "model", "--file", "p"], "--file p",
         both(copy_export, write("p/x", "x"))),
    # places it writes: a file in the way, a place it cannot write
    Case("convert-output-unwritable", "unwritable", ["convert", "model", "--output", UNWRITABLE], UNWRITABLE,
         copy_export),
    Case("convert-output-is-a-file", "wrong type", ["convert", "model", "--output", "taken"], "taken",
         both(copy_export, write("taken", "a file"))),
    Case("upcycle-output-unwritable", "unwritable", ["upcycle", "model", "-o", UNWRITABLE], UNWRITABLE, copy_export),
    Case("upcycle-output-is-a-file", "wrong type", ["upcycle", "model", "-o", "taken"], "taken",
         both(copy_export, write("taken", "a file"))),
    Case("eval-output-unwritable", "unwritable", [*EVAL, "--output", UNWRITABLE], UNWRITABLE,
         both(copy_export, eval_task)),
    Case("corpus-output-is-a-file", "wrong type", ["data", "corpus", "-o", "taken"], "taken", write("taken", "a file")),
    Case("corpus-output-unwritable", "unwritable", ["data", "corpus", "-o", UNWRITABLE], UNWRITABLE),
    Case("jobs-cache-is-a-file", "wrong type", ["jobs", "list"], "ZEBRA_CACHE", write("cache", "a file"), env=JOBS),
    # outputs that are an input through a symbolic link (resolved before the comparison)
    Case("eval-output-linked-to-model", "through a symlink", ["eval", "model", "--output", "res"], "the model",
         both(copy_export, link("res", "model"))),
    Case("upcycle-output-linked-to-teacher", "through a symlink", ["upcycle", "model", "-o", "s", "--force"],
         "the teacher", both(copy_export, link("s", "model"))),
    Case("prep-output-linked-to-source", "through a symlink", [*PREP, "--source", "corpus", "-o", "out"], "--source",
         both(write("corpus/a.jsonl", JSONL), link("out", "corpus"))),
    Case("convert-output-linked-into-run", "through a symlink", ["convert", "runs/r", "--output", "o/hf"],
         "the source", both(copy_run, link("o", "runs/r/checkpoints"))),
    Case("plot-output-linked-to-metrics", "through a symlink", ["plot", "runs/r", "-o", "loss.png"], "metrics.jsonl",
         both(copy_run, link("loss.png", "runs/r/metrics.jsonl"))),
    # a model folder that is empty, for every command that loads one
    Case("generate-model-empty", "empty", ["generate", "e", "-p", "hi"], "e", write("e/.keep", "")),
    Case("chat-model-empty", "empty", ["chat", "e"], "e", write("e/.keep", "")),
    Case("eval-model-empty", "empty", ["eval", "e"], "e", write("e/.keep", "")),
    Case("verify-model-empty", "empty", ["verify", "e"], "e", write("e/.keep", "")),
    Case("convert-source-empty", "empty", ["convert", "e", "--output", "out"], "e", write("e/.keep", "")),
    Case("upcycle-teacher-empty", "empty", ["upcycle", "e", "-o", "s"], "e", write("e/.keep", "")),
    Case("inspect-data-empty", "empty", ["data", "inspect", "e"], "e", write("e/.keep", "")),
    # numbers past what a session takes, and the places doctor checks
    Case("chat-max-huge", "wrong type", ["chat", "model", "--max-new", "2", "--temperature", "0"], "usage: /max",
         copy_export, stdin=b"/max 99999999999999999999\n/quit\n", code=0),
    # doctor reports it (a warning with its fix) and exits 0, as for every check short of --require; the words come
    # before the (temporary, long) path, which the table folds where its length says
    Case("doctor-cache-is-a-file", "wrong type", ["doctor"], "a file is in the way", write("cache", "a file"),
         env=JOBS, code=0),
    # interrupted: what a kill leaves (a save or a write cut short, a step not taken), read again
    Case("train-checkpoint-cut-short", "interrupted",
         ["train", "tiny", "--output", "runs", "--run", "r", "--max-steps", str(STEPS), *TINY], f"step_{STEPS:07d}",
         both(copy_run, cut_short(f"runs/r/checkpoints/step_{STEPS:07d}/__0_0.distcp")), leaves=(LOCK,)),
    Case("train-data-cache-cut-short", "interrupted",
         ["train", "tiny", "--output", "runs", "--run", "r", "--max-steps", str(STEPS), *TINY], "sample_index",
         both(copy_run, lambda d, run: shutil.copytree(run / "data_cache", d / "runs/r/data_cache"),
              lambda d, run: cut_short(str(next((d / "runs/r/data_cache").glob("*train-sample_index.npy"))))(d, run)),
         leaves=(LOCK,)),
    Case("plot-metrics-torn-line", "interrupted", ["plot", "runs/r", "-o", "l.png"], "l.png",
         both(copy_run, append("runs/r/metrics.jsonl", '{"step": 3, "lo')),
         code=0, leaves=("l.png",), max_lines=0),
    Case("generate-run-without-export", "interrupted", ["generate", "runs/r", "-p", "hi", "--max-new", "2"],
         "exporting its newest checkpoint", both(copy_run, lambda d, run: shutil.rmtree(d / "runs/r/export")),
         code=0, leaves=("runs/r/export",), max_lines=1),
]  # fmt: skip


# --- running them ----------------------------------------------------------------------------------------------

PROGRESS = re.compile(r"\d+%\||it/s\]|s/it\]|examples/s\]")  # a library's progress bar (tqdm), not a message


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    before: dict[str, str]  # relative path -> sha256 of every file the case started with
    after: dict[str, str]
    seconds: float  # how long the command ran (shown with a failure)


def checksums(folder: Path) -> dict[str, str]:
    sums = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            sums[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            sums[str(path.relative_to(folder))] = "empty folder"
    return sums


# The environment before any test ran (modules are imported at collection): a user's shell, not what an earlier
# in-process command set for itself (zebra's kernel cache folders, which `zebra doctor` then reports as "set by you").
PRISTINE = dict(os.environ)


def case_env(case: Case, folder: Path) -> dict[str, str]:
    """What the case's command adds to the environment."""
    env = {"COLUMNS": "200", "HF_HUB_OFFLINE": "1", "ZEBRA_DEBUG": ""}
    return env | {k: v.format(d=folder) for k, v in case.env.items()}


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Run in `folder` as a process would: the working directory and the environment as they were afterwards
    (what a command sets, e.g. zebra's kernel cache folders, goes with it)."""
    here, environ = os.getcwd(), dict(os.environ)
    os.chdir(folder)
    os.environ.clear()
    os.environ.update(PRISTINE)  # not what an earlier in-process command of the session set for itself
    try:
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)


def in_process(case: Case, folder: Path) -> tuple[int, str, str]:
    """The case through CliRunner in `folder`: (status, stdout, stderr); an exception that escaped the CLI's
    handlers is put on stderr as the traceback a user would see."""
    with inside(folder):
        result = CliRunner().invoke(app, case.argv, input=case.stdin or None, env=case_env(case, folder))
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return result.exit_code, result.stdout, stderr


def as_process(case: Case, folder: Path, environ: dict[str, str]) -> tuple[int, str, str]:
    """The case as a real `zebra` process in `folder`, with its stdout piped, closed or /dev/full and its file
    size limit; `environ`: the environment to start from."""
    limit = case.fsize

    def child_setup() -> None:
        if case.stdout == "closed":
            os.close(1)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    sink = open("/dev/full", "w") if case.stdout == "full" else None  # noqa: SIM115 (closed below)
    try:
        done = subprocess.run(
            [sys.executable, "-c", ENTRY, *case.argv],
            input=case.stdin,
            stdout=sink or subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=folder,
            env={**environ, **case_env(case, folder)},
            timeout=300,
            preexec_fn=child_setup,
        )
    finally:
        if sink:
            sink.close()
    return (
        done.returncode,
        (done.stdout or b"").decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )


def run_case(case: Case, folder: Path, made: Path, environ: dict[str, str]) -> Outcome:
    folder.mkdir(parents=True)
    if case.setup:
        case.setup(folder, made)
    before = checksums(folder)
    start = time.monotonic()
    if case.in_process:
        code, stdout, stderr = in_process(case, folder)
    else:
        code, stdout, stderr = as_process(case, folder, environ)
    return Outcome(code, stdout, stderr, before, checksums(folder), time.monotonic() - start)


def made_run(root: Path) -> Path:
    """`zebra train tiny` for STEPS steps in this process (byte tokenizer, bundled corpus): a run folder with
    checkpoints, metrics.jsonl, config.yaml and export/, the model every case copies."""
    with inside(root):
        argv = ["train", "tiny", "--max-steps", str(STEPS), "--yes", "--output", "runs", *TINY]
        result = CliRunner().invoke(app, argv, env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, result.output + result.stderr
    return root / "runs" / "tiny"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    return made_run(tmp_path_factory.mktemp("made"))


@pytest.fixture(scope="module")
def process_cases(made, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """The cases that run as real processes, started in two threads when the first case asks for them: they run
    beside the in-process cases, which run one at a time in the tests (they change the working directory)."""
    root = tmp_path_factory.mktemp("bad-input-processes")
    environ = dict(os.environ)  # before an in-process case sets its variables
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {c.id: pool.submit(run_case, c, root / c.id, made, environ) for c in CASES if not c.in_process}


def check_contract(case: Case, got: Outcome) -> None:
    """The contract of the module docstring, for one case's outcome (an AssertionError says what broke)."""
    said = f"{case.id}: exit {got.returncode} after {got.seconds:.1f} s\nstderr:\n{got.stderr}\nstdout:\n{got.stdout[-2000:]}"
    assert "looks like a bug" not in got.stderr, (
        said
    )  # the catch-all is for bugs, and this is the user's input
    assert "Traceback" not in got.stderr + got.stdout, said
    if case.code is None:
        assert got.returncode not in (0, None), said
    else:
        assert got.returncode == case.code, said
    lines = [line for line in got.stderr.splitlines() if line.strip() and not PROGRESS.search(line)]
    assert len(lines) <= case.max_lines, said
    assert case.culprit in got.stderr + got.stdout, said
    changed = [p for p, s in got.before.items() if got.after.get(p) != s]
    assert not changed, f"{said}\ninputs changed or removed: {changed}"
    new = [p for p in got.after if p not in got.before and not p.startswith(case.leaves or ("\0",))]
    assert not new, f"{said}\nleft behind: {new}"


def test_the_suite_covers_every_family():
    families = {case.family for case in CASES}
    assert families == {"broken", "empty", "binary", "truncated", "wrong type", "unwritable",
                        "through a symlink", "output inside input", "interrupted"}  # fmt: skip
    assert len({case.id for case in CASES}) == len(CASES) >= 110


def test_the_contract_fails_on_the_catch_all(tmp_path, monkeypatch):
    """A bug behind a user's input (a raw exception from the library) reaches the catch-all: the contract fails."""
    import zebra.recipes

    def broken(*args, **kwargs):
        raise KeyError("model")

    monkeypatch.setattr(zebra.recipes, "load_recipe", broken)
    case = Case("a-bug", "broken", ["recipes", "show", "tiny"], "tiny")
    got = run_case(case, tmp_path / "a-bug", tmp_path, dict(os.environ))
    assert "looks like a bug" in got.stderr and got.returncode == 1
    with pytest.raises(AssertionError, match="a-bug"):
        check_contract(case, got)


# the process cases last: they run in threads from the first case on, and are done by the time they are read
ORDER = sorted(CASES, key=lambda case: not case.in_process)


@pytest.mark.parametrize("case", ORDER, ids=[case.id for case in ORDER])
def test_bad_input_keeps_the_contract(
    case: Case, made: Path, process_cases: dict[str, Future], tmp_path: Path
):
    if case.in_process:
        got = run_case(case, tmp_path / case.id, made, dict(os.environ))
    else:
        got = process_cases[case.id].result()
    check_contract(case, got)
