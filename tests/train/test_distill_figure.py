"""scripts/pack-corpus.py and scripts/distill-figure.py end to end on the CPU at toy size: a corpus folder made of the
bundled text (byte tokens), packed, archived in parts and unpacked as the GPU side does; the figure stopped by its
deadline, resumed to the end, and a third call that finds everything done."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.upcycle.teachers import tiny_llama

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def corpus_from(prefix: str, folder: Path) -> Path:
    """A `zebra data corpus`-shaped folder (train/, heldout/) whose two splits are the same prepared prefix."""
    for split in ("train", "heldout"):
        (folder / split).mkdir(parents=True)
        for ext in ("bin", "idx"):
            shutil.copyfile(f"{prefix}.{ext}", folder / split / f"{split}_00000.{ext}")
        shutil.copyfile(Path(prefix).parent / "manifest.json", folder / split / "manifest.json")
    return folder


def run(script: str, *args: str, timeout: int = 2400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def packed(tmp_path_factory, sample_prefix) -> tuple[Path, dict]:
    """The packed folder as unpacked from its archive parts (tiny parts, so there are several)."""
    root = tmp_path_factory.mktemp("pack")
    corpus = corpus_from(sample_prefix, root / "corpus")
    done = run("pack-corpus.py", str(corpus), "--train-tokens", "60k", "--heldout-tokens", "20k", "-o",
               str(root / "pack"), "--archive", str(root / "parts" / "toy"), "--part-mib", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    parts = sorted((root / "parts").glob("toy.tar.xz.*"))
    assert parts and all(p.stat().st_size <= 2**20 for p in parts)
    unpack = next(line for line in done.stdout.splitlines() if line.startswith("unpack"))
    command = unpack.split(": ", 1)[1].replace("DEST", str(root / "gpu"))
    (root / "gpu").mkdir()
    subprocess.run(command, shell=True, check=True, cwd=root / "parts")
    data = root / "gpu" / "data"
    return data, json.loads((data / "pack.json").read_text())


def test_the_pack_holds_whole_documents_train_first_then_held_out(packed, sample_prefix):
    from zebra.data import read_manifest
    from zebra.data.indexed import open_dataset

    data, pack = packed
    dataset = open_dataset(str(data / "data_00000"))
    assert len(dataset) == pack["train_documents"] + pack["heldout_documents"]
    assert pack["split"] == f"{pack['train_documents']},{pack['heldout_documents']},0"
    train = sum(len(dataset[i]) for i in range(pack["train_documents"]))
    heldout = sum(len(dataset[i]) for i in range(pack["train_documents"], len(dataset)))
    assert train >= 60_000 and heldout >= 20_000
    assert train + heldout == pack["tokens"] == read_manifest(data).tokens
    source = open_dataset(sample_prefix)
    documents = {tuple(source[i].tolist()) for i in range(len(source))}
    assert all(tuple(dataset[i].tolist()) in documents for i in range(len(dataset)))  # whole documents


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the second call alone took over 15 minutes on the shared 2-core CPU (load 20)
def test_the_figure_stops_at_its_deadline_and_resumes_to_the_end(tmp_path, packed):
    data, _ = packed
    teacher = tiny_llama(tmp_path / "teacher", num_hidden_layers=4, seed=3)
    out = tmp_path / "figure"
    args = [str(teacher), "--data", str(data), "--tokens", "2600", "--seq-len", "32", "--batch", "4",
            "--micro-batch", "4", "--mixers", "gdn", "--mla", "2", "--evals", "1", "--calibrate-samples", "2",
            "--calibrate-seq-len", "16", "--calibrate-steps", "2", "--smart-samples", "2", "--eval-examples",
            "6", "--heldout-windows", "2", "--device", "cpu", "--ild-fraction", "0.2", "--output", str(out)]  # fmt: skip
    stopped = run("distill-figure.py", *args, "--deadline-seconds", "0")
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    assert "run the same command again" in stopped.stdout
    record = json.loads((out / "figure.json").read_text())
    assert "heldout_ce" in record["teacher"] and "step0_ce" not in record.get("gdn", {})
    assert not (out / "distill-gdn" / "stages.json").exists()  # no stage was started

    done = run("distill-figure.py", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "figure.json").read_text())
    teacher_ce = record["teacher"]["heldout_ce"]
    student, scratch = record["gdn"], record["scratch-gdn"]
    assert (
        math.isfinite(teacher_ce)
        and math.isfinite(student["step0_ce"])
        and math.isfinite(student["heldout_ce"])
    )
    assert student["step0_pattern"].count("*") == 2  # the hybrid's two MLA layers
    assert math.isfinite(student["kd_start_ce"])  # KD's init, the pipeline's composed hybrid (after ILD here)
    stage_steps = sum(s["steps"] for s in student["stages"].values() if s["kind"] == "train")
    assert scratch["steps"] == stage_steps and scratch["tokens_per_step"] == student["tokens_per_step"]
    assert student["stages"]["kd"]["curve"] and scratch["curve"]
    assert student["pipeline"]["upcycle-rec"]["result"]["calibration"]["steps"] == 2
    assert set(record["eval"]) == {"teacher", "gdn", "scratch-gdn"}
    assert record["eval"]["teacher"]["retention"] == 1.0
    assert (out / "figure.png").stat().st_size > 0

    again = run("distill-figure.py", *args)
    assert again.returncode == 0 and "stage" not in again.stdout  # nothing redone
    assert json.loads((out / "figure.json").read_text())["eval"] == record["eval"]

    # a scratch twin alone in its own process (the hybrid's shape from the run above) ...
    twin = tmp_path / "twin"
    done = run("distill-figure.py", *args[:-1], str(twin), "--mixers", "none", "--scratch", "gdn",
               "--shape-from", student["step0_export"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    alone = json.loads((twin / "figure.json").read_text())
    assert "gdn" not in alone and not (twin / "distill-gdn").exists()
    assert alone["scratch-gdn"]["steps"] == stage_steps and set(alone["eval"]) == {"teacher", "scratch-gdn"}
    # ... and a variant beside it, no ILD (zebra distill --ild-fraction 0) on the first run's calibrated students
    # (--upcycled-from), with that twin in its figure
    variant = tmp_path / "variant"
    done = run("distill-figure.py", *args[:-1], str(variant), "--ild-fraction", "0", "--scratch", "none",
               "--include", str(twin), "--upcycled-from", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((variant / "figure.json").read_text())
    assert list(record["gdn"]["stages"]) == ["upcycle-mla", "upcycle-rec", "hybrid", "kd"]
    taken = record["gdn"]["pipeline"]["upcycle-rec"]["result"]
    assert (
        taken["upcycled_from"] == str(out / "distill-gdn" / "upcycle-rec")
        and taken["calibration"]["steps"] == 2
    )
    assert record["scratch-gdn"] == alone["scratch-gdn"]
    # without ILD, KD starts from the calibrated students composed by SMART: step 0 as the pipeline has it
    assert (
        math.isfinite(record["gdn"]["kd_start_ce"]) and record["gdn"]["kd_start_ce"] != student["kd_start_ce"]
    )
    assert set(record["eval"]) == {"teacher", "gdn", "scratch-gdn"}
    assert record["eval"]["scratch-gdn"] == alone["eval"]["scratch-gdn"]  # included, not evaluated again


def test_included_outputs_join_the_figure_a_label_keeps_a_variant_apart(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("distill_figure", SCRIPTS / "distill-figure.py")
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    teacher = {"heldout_ce": 2.5}
    own = {
        "teacher": teacher,
        "mamba2": {"heldout_ce": 3.0},
        "eval": {"teacher": {"acc": 0.9}, "mamba2": {"acc": 0.8}},
    }
    for name, record in {
        "twin": {"teacher": teacher, "scratch-mamba2": {"heldout_ce": 6.0}, "eval": {"teacher": {"acc": 0.9},
                 "scratch-mamba2": {"acc": 0.4}}},
        "variant": {"teacher": teacher, "mamba2": {"heldout_ce": 2.9}, "eval": {"teacher": {"acc": 0.91},
                    "mamba2": {"acc": 0.85}}},
        "unfinished": {"teacher": teacher, "mamba2": {"stages": {}}},
    }.items():  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "figure.json").write_text(json.dumps(record))
    figure.include(
        own, [str(tmp_path / "twin"), f"{tmp_path / 'variant'}=kd 3e-4", str(tmp_path / "unfinished")]
    )
    assert own["mamba2"] == {"heldout_ce": 3.0} and own["mamba2 (kd 3e-4)"] == {"heldout_ce": 2.9}
    assert own["scratch-mamba2"] == {"heldout_ce": 6.0} and "teacher (kd 3e-4)" not in own
    assert own["eval"] == {"teacher": {"acc": 0.9}, "mamba2": {"acc": 0.8}, "scratch-mamba2": {"acc": 0.4},
                           "mamba2 (kd 3e-4)": {"acc": 0.85}}  # fmt: skip
