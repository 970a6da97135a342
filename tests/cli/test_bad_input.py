"""The bad-input suite: every command, fed families of bad input (broken, empty, binary, truncated, wrong type,
unwritable, read through a link, output inside input, a file cut short as by a kill), keeps the contract of
docs/development.md "Bad input":

- it exits with the case's status (non-zero unless the input is one zebra reads on purpose, as documented);
- stderr holds at most two lines (the error and its fix), which name the culprit (file, key or flag);
- never the catch-all ("this looks like a bug") nor a traceback: this suite fails if one is reached;
- every file that existed before is unchanged (SHA-256), and nothing new is left behind (no half-written
  output, no temporary file), unless the case names what it may leave.

Each case runs `zebra` as a real process (the CLI root and its catch-all are the ones a user meets) in a folder of
its own. The cases run a few at a time in one session fixture (most are seconds of interpreter start-up), and each
case is its own test. Read-only places are the parts of /sys (sysfs refuses new files to root too), a full disk is
RLIMIT_FSIZE (a write past it fails with EFBIG, as one past a full disk fails with ENOSPC): both hold as root, in CI.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.cli.conftest import ENTRY
from tests.generation.conftest import trained_tiny_run

UNWRITABLE = "/sys/zebra-bad-input"  # sysfs: no new file or folder, even for root
# the run folder's lock file (zebra.locks), which stays beside a run as it does after any run; the question about
# an earlier run's results is asked with the lock held, so that a run in progress is told as one
LOCK = "runs/r/.lock"


@dataclass(frozen=True)
class Case:
    """One bad input: `setup(folder, run)` makes it in the case's folder (`run`: a trained tiny run to copy from),
    `argv` is the command ({d}: the case's folder), `culprit`: what stderr must name."""

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


# --- inputs ----------------------------------------------------------------------------------------------------


def write(rel: str, data: bytes | str) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return make


def both(*steps: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        for step in steps:
            step(d, run)

    return make


def copy_run(d: Path, run: Path) -> None:
    shutil.copytree(run, d / "runs" / "r", ignore=shutil.ignore_patterns(".lock", "data_cache"))


def copy_export(d: Path, run: Path) -> None:
    shutil.copytree(run / "export", d / "model")


def edit_json(rel: str, change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def make(d: Path, run: Path) -> None:
        data = json.loads((d / rel).read_text())
        change(data)
        (d / rel).write_text(json.dumps(data))

    return make


def nan_weights(d: Path, run: Path) -> None:
    from safetensors.torch import load_file, save_file

    shard = next((d / "model").glob("*.safetensors"))
    tensors = load_file(shard)
    tensors[next(k for k in tensors if k.endswith("down_proj.weight"))][0, 0] = float("nan")
    save_file(tensors, shard, metadata={"format": "pt"})


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


JSONL = b'{"text": "a document of the corpus"}\n{"text": "another one"}\n'
GZ = gzip.compress(JSONL * 50)
# the trained run's settings (tests/generation/conftest.py), so that resuming it changes none
RUN_SETS = {"train.global_batch_size": 4, "train.micro_batch_size": 4, "data.seq_len": 64, "train.warmup_steps": 4,
            "train.eval_interval": 40, "train.save_interval": 40}  # fmt: skip
TINY = [arg for key, value in RUN_SETS.items() for arg in ("--set", f"{key}={value}")]
PREP = ["data", "prep", "--tokenizer", "byte", "--yes", "--workers", "1"]


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
    # train: run folders and where it writes
    Case("train-results-without-checkpoint", "interrupted",
         ["train", "tiny", "--mock-data", "--output", "runs", "--run", "r", "--max-steps", "1", *TINY],
         "no checkpoint to resume", both(copy_run, drop_checkpoints), leaves=(LOCK,)),
    Case("train-config-not-yaml", "broken",
         ["train", "tiny", "--output", "runs", "--run", "r", "--max-steps", "41", *TINY, "--dry-run"],
         "config.yaml", both(copy_run, write("runs/r/config.yaml", "{{{ not: [yaml"))),
    Case("train-checkpoint-meta-wrong-types", "wrong type",
         ["train", "tiny", "--output", "runs", "--run", "r", "--max-steps", "40", *TINY], "meta.json",
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
    Case("corpus-unknown-source", "wrong type", ["data", "corpus", "-o", "c", "--sources", "novels"], "novels"),
    Case("convert-output-inside-checkpoints", "output inside input",
         ["convert", "runs/r", "--output", "runs/r/checkpoints/hf"], "is inside the source", copy_run),
    Case("verify-config-does-not-fit", "wrong type", ["verify", "model"], "do not fit",
         both(copy_export, edit_json("model/config.json", wider_mlp))),
    Case("verify-weights-cut-short", "interrupted", ["verify", "model"], "model",
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
         setup=copy_export, stdin=b"caf\xe9 au lait\n/quit\n", max_lines=0),
    Case("eval-output-is-a-file", "wrong type", ["eval", "model", "--tasks", "arc_easy", "--output", "r.json"],
         "r.json", both(copy_export, write("r.json", '{"earlier": "results"}'))),
    Case("eval-output-inside-model", "output inside input", ["eval", "model", "--output", "model/results"],
         "is inside the model", copy_export),
    Case("generate-max-new-zero", "wrong type", ["generate", "model", "-p", "hi", "--max-new", "0"], "--max-new",
         code=2, max_lines=5),  # a flag's range is Click's: its usage error, status 2, in a box of five lines
    Case("upcycle-seq-len-huge", "wrong type", ["upcycle", "model", "-o", "s", "--seq-len", "99999999"], "--seq-len",
         code=2, max_lines=5),
    # stdout
    Case("stdout-closed", "unwritable", ["recipes", "list"], "stdout", stdout="closed"),
    Case("stdout-full", "unwritable", ["recipes", "list"], "stdout", stdout="full"),
    Case("stdout-full-yaml", "unwritable", ["recipes", "show", "tiny"], "stdout", stdout="full"),
]  # fmt: skip


# --- running them ----------------------------------------------------------------------------------------------


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
        elif path.is_dir() and not any(path.iterdir()):
            sums[str(path.relative_to(folder))] = "empty folder"
    return sums


def run_case(case: Case, folder: Path, run: Path) -> Outcome:
    folder.mkdir(parents=True)
    if case.setup:
        case.setup(folder, run)
    before = checksums(folder)
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    env.update({k: v.format(d=folder) for k, v in case.env.items()})
    stdout: int | str = subprocess.PIPE
    if case.stdout == "full":
        stdout = "/dev/full"
    limit = case.fsize

    def child_setup() -> None:
        if case.stdout == "closed":
            os.close(1)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    sink = open(stdout, "w") if isinstance(stdout, str) else None  # noqa: SIM115 (closed below)
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", ENTRY, *case.argv],
            input=case.stdin,
            stdout=sink or stdout,
            stderr=subprocess.PIPE,
            cwd=folder,
            env=env,
            timeout=300,
            preexec_fn=child_setup,
        )
    finally:
        if sink:
            sink.close()
    text = (done.stdout or b"").decode(errors="replace")
    seconds = time.monotonic() - start
    stderr = done.stderr.decode(errors="replace")
    return Outcome(done.returncode, text, stderr, before, checksums(folder), seconds)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every case's outcome: the cases run three at a time (most are interpreter start-up), each in its folder."""
    run = trained_tiny_run(tmp_path_factory.getbasetemp())
    root = tmp_path_factory.mktemp("bad-input")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {case.id: pool.submit(run_case, case, root / case.id, run) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


def test_the_suite_covers_every_family():
    families = {case.family for case in CASES}
    assert families == {"broken", "empty", "binary", "truncated", "wrong type", "unwritable",
                        "through a symlink", "output inside input", "interrupted"}  # fmt: skip
    assert len({case.id for case in CASES}) == len(CASES) >= 57


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_keeps_the_contract(case: Case, outcomes: dict[str, Outcome]):
    got = outcomes[case.id]
    said = f"{case.id}: exit {got.returncode} after {got.seconds:.1f} s\nstderr:\n{got.stderr}\nstdout:\n{got.stdout[-2000:]}"
    assert "looks like a bug" not in got.stderr, (
        said
    )  # the catch-all is for bugs, and this is the user's input
    assert "Traceback" not in got.stderr + got.stdout, said
    if case.code is None:
        assert got.returncode not in (0, None), said
    else:
        assert got.returncode == case.code, said
    lines = [line for line in got.stderr.splitlines() if line.strip()]
    assert len(lines) <= case.max_lines, said
    assert case.culprit in got.stderr + got.stdout, said
    changed = [p for p, s in got.before.items() if got.after.get(p) != s]
    assert not changed, f"{said}\ninputs changed or removed: {changed}"
    new = [p for p in got.after if p not in got.before and not p.startswith(case.leaves or ("\0",))]
    assert not new, f"{said}\nleft behind: {new}"
