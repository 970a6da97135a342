"""`zebra distill`: the whole pipeline (two students, ILD of each, SMART, KD) on a tiny random Llama teacher and the
bundled corpus in one command, its resume after a kill -9, and the one-line refusals before any work."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from tests.upcycle.teachers import tiny_llama

from zebra.folders.checkpoint_dir import committed

from .helpers import invoke_in_process, records, wait_for, zebra_process


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("teacher") / "llama", num_hidden_layers=4, seed=3)


@pytest.fixture(scope="module")
def data(sample_prefix) -> str:
    return str(Path(sample_prefix).parent)  # the prepared folder (its manifest names the byte tokenizer)


def distill_args(teacher, data, out, tokens="6k", *extra) -> list[str]:
    """2 steps for each ILD stage and 18 for KD, of 8 x 32 tokens, an evaluation and checkpoint every 2 ILD steps."""
    return ["distill", str(teacher), "--data", data, "--tokens", tokens, "--seq-len", "32", "--batch", "8",
            "--mla", "2", "--mixer", "gdn", "--device", "cpu", "--evals", "1", "-o", str(out),
            "--set", "data.split=90,10,0", "--set", "train.eval_steps=1", "--calibrate-lr", "2e-3",
            "--calibrate-schedule", "cosine", "--ild-fraction", "0.2", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, teacher, data):
    out = tmp_path_factory.mktemp("pipeline") / "out"
    result = invoke_in_process(*distill_args(teacher, data, out))
    assert result.exit_code == 0, result.output
    return out, result.output


def test_one_command_runs_every_stage_into_one_folder(pipeline):
    out, output = pipeline
    state = json.loads((out / "stages.json").read_text())
    names = ["upcycle-mla", "upcycle-rec", "ild-mla", "ild-rec", "hybrid", "kd"]
    assert list(state["stages"]) == names
    assert {s["status"] for s in state["stages"].values()} == {"done"}
    stages = {name: s["result"] for name, s in state["stages"].items()}
    assert [stages[n]["steps"] for n in ("ild-mla", "ild-rec", "kd")] == [2, 2, 18]
    assert stages["upcycle-mla"]["pattern"] == "*-*-*-*-" and set(stages["upcycle-rec"]["pattern"][::2]) == {
        "G"
    }
    for name in ("upcycle-mla", "upcycle-rec"):  # calibrated on --data: every mixer's fit lowered its error
        layers = stages[name]["calibration"]["layers"]
        assert len(layers) == 4 and all(f["error_fit"] < f["error_upcycled"] for f in layers), layers
        # the --calibrate-* flags reach both upcycles; teacher-forced, zebra distill's default
        calibration = stages[name]["calibration"]
        assert (calibration["lr"], calibration["schedule"], calibration["sequential"]) == (
            2e-3,
            "cosine",
            False,
        )
    hybrid = json.loads((out / "hybrid" / "upcycle.json").read_text())
    assert hybrid["placement"] == "smart" and len(hybrid["smart"]["scores"]) == 4
    assert hybrid["students"] == {
        "mla": str(out / "ild-mla" / "export"),
        "recurrent": str(out / "ild-rec" / "export"),
    }
    assert stages["hybrid"]["mla_layers"] == hybrid["mla_layers"] and len(hybrid["mla_layers"]) == 2
    kd = json.loads((out / "kd" / "export" / "config.json").read_text())
    assert kd["layer_pattern"] == hybrid["pattern"]
    teacher_ce = {stages[n]["teacher_heldout_ce"] for n in ("ild-mla", "ild-rec", "kd")}
    assert len(teacher_ce) == 1  # the same held-out batches in every stage
    evals = [r for r in records(out / "kd") if "val_loss" in r]
    assert evals[-1]["val_loss"] == stages["kd"]["heldout_ce"] and evals[-1]["teacher_val_loss"] in teacher_ce
    assert (out / "loss.png").stat().st_size > 0
    assert all(stage["seconds"] > 0 for stage in stages.values())  # each stage's wall time
    total = sum(stage["seconds"] for stage in stages.values())
    assert f"zebra distill, {total:,.0f} s in all" in output
    assert "kd step 18/18" in output and "held-out CE" in output and "distilled student" in output


def test_without_ild_the_calibrated_students_are_composed_and_kd_gets_every_token(tmp_path, teacher, data):
    out = tmp_path / "out"
    result = invoke_in_process(*distill_args(teacher, data, out, "6k", "--ild-fraction", "0"))
    assert result.exit_code == 0, result.output
    state = json.loads((out / "stages.json").read_text())["stages"]
    assert list(state) == ["upcycle-mla", "upcycle-rec", "hybrid", "kd"]
    assert state["kd"]["result"]["steps"] == 6000 // (8 * 32) and "stage 4/4" in result.output
    hybrid = json.loads((out / "hybrid" / "upcycle.json").read_text())
    assert hybrid["students"] == {"mla": str(out / "upcycle-mla"), "recurrent": str(out / "upcycle-rec")}


def test_a_second_call_skips_what_is_done(pipeline, teacher, data):
    """Also for a folder started before an option existed: stages.json without it reads as its default."""
    out, _ = pipeline
    before = (out / "stages.json").read_text()
    older = json.loads(before)
    del older["options"]["calibrate_pass_through"], older["options"]["calibrate_output_lstsq"]
    (out / "stages.json").write_text(json.dumps(older))
    result = invoke_in_process(*distill_args(teacher, data, out))
    assert result.exit_code == 0, result.output
    assert result.output.count("done before, skipped") == 6
    assert json.loads((out / "stages.json").read_text())["stages"] == json.loads(before)["stages"]


def test_upcycled_from_takes_another_pipelines_upcycle_stages_as_they_are(pipeline, tmp_path, teacher, data):
    """A KD variant of the same teacher, data, mixer and calibration: both upcycled students are the first
    pipeline's files (hard links: nothing calibrated again), recorded with where they came from."""
    import os

    source, _ = pipeline
    out = tmp_path / "variant"
    result = invoke_in_process(*distill_args(teacher, data, out, "6k", "--ild-fraction", "0", "--kd-lr", "5e-4",
                                             "--upcycled-from", str(source)))  # fmt: skip
    assert result.exit_code == 0, result.output
    state = json.loads((out / "stages.json").read_text())["stages"]
    before = json.loads((source / "stages.json").read_text())["stages"]
    for name in ("upcycle-mla", "upcycle-rec"):
        taken = state[name]["result"]
        assert taken["upcycled_from"] == str(source / name) and taken["export"] == str(out / name)
        assert taken["calibration"] == before[name]["result"]["calibration"]
        for file in (source / name).iterdir():
            assert os.stat(out / name / file.name).st_ino == os.stat(file).st_ino, file.name
    assert state["kd"]["status"] == "done" and state["hybrid"]["result"]["export"] == str(out / "hybrid")


def test_upcycled_from_a_folder_upcycled_otherwise_or_unfinished_is_refused(
    pipeline, tmp_path, teacher, data
):
    source, _ = pipeline
    result = invoke_in_process(*distill_args(teacher, data, tmp_path / "a", "6k", "--calibrate-steps", "7",
                                             "--upcycled-from", str(source)))  # fmt: skip
    _refused(
        result,
        tmp_path / "a",
        f"--upcycled-from {source}: upcycled with other options (calibrate_steps differ)",
    )
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    state = json.loads((source / "stages.json").read_text())
    state["stages"]["upcycle-rec"]["status"] = "running"
    (unfinished / "stages.json").write_text(json.dumps(state))
    result = invoke_in_process(
        *distill_args(teacher, data, tmp_path / "b", "6k", "--upcycled-from", str(unfinished))
    )
    _refused(result, tmp_path / "b", f"--upcycled-from {unfinished}: its upcycle-mla stage is not done")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke_in_process(
        *distill_args(teacher, data, tmp_path / "c", "6k", "--upcycled-from", str(empty))
    )
    _refused(result, tmp_path / "c", f"--upcycled-from {empty}: no readable stages.json there")
    inside = source / "variant"  # an output in the folder it reads from
    result = invoke_in_process(*distill_args(teacher, data, inside, "6k", "--upcycled-from", str(source)))
    _refused(result, inside, f"--output {inside} is inside --upcycled-from {source}")


def test_killed_mid_stage_it_resumes_at_that_stage_and_its_checkpoint(tmp_path, teacher, data):
    """SIGTERM in KD stops it (its time so far recorded); the next call resumes it and is killed -9 after a newer
    checkpoint; the call after that skips the done stages, resumes KD from that checkpoint and adds its time."""
    out = tmp_path / "out"
    args = distill_args(teacher, data, out, "40k", "--evals", "8")  # KD: 125 steps, a checkpoint every 15
    proc = zebra_process(*args)
    wait_for(lambda: bool(committed(out / "kd" / "checkpoints")), proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    stopped = json.loads((out / "stages.json").read_text())["stages"]["kd"]
    assert stopped["status"] == "stopped" and stopped["result"]["seconds"] > 0
    first = {p.name for p in committed(out / "kd" / "checkpoints")}
    proc = zebra_process(*args)
    wait_for(lambda: bool({p.name for p in committed(out / "kd" / "checkpoints")} - first), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    state = json.loads((out / "stages.json").read_text())["stages"]
    assert state["kd"]["status"] == "running" and state["ild-rec"]["status"] == "done"
    saved = sorted(int(p.name.split("_")[1]) for p in committed(out / "kd" / "checkpoints"))
    result = invoke_in_process(*args)
    assert result.exit_code == 0, result.output
    assert result.output.count("done before, skipped") == 5
    assert f"resumed from {out / 'kd' / 'checkpoints' / f'step_{saved[-1]:07d}'}" in result.output
    done = json.loads((out / "stages.json").read_text())["stages"]
    assert done["kd"]["status"] == "done"
    assert done["ild-rec"]["result"]["seconds"] == state["ild-rec"]["result"]["seconds"]  # skipped: kept
    assert done["kd"]["result"]["seconds"] > stopped["result"]["seconds"]  # both calls' time
    steps = [r["step"] for r in records(out / "kd") if "loss" in r]  # a line every 10 steps (tiny's)
    assert steps == [*range(10, 121, 10), 125]  # each once: the steps after the checkpoint are not doubled


def _refused(result, out: Path, *needles: str) -> None:
    assert result.exit_code == 1 and "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output
    assert not (out / "stages.json").exists()


def test_a_teacher_zebra_cannot_upcycle_is_refused_before_any_work(tmp_path, teacher, data):
    other = tmp_path / "gpt2"
    shutil.copytree(teacher, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    result = invoke_in_process(*distill_args(other, data, tmp_path / "out"))
    _refused(result, tmp_path / "out", "model_type 'gpt2' is not a Llama-family Transformer")


def test_data_in_another_tokenizer_is_refused_before_any_work(tmp_path, teacher, data):
    from zebra.data.tokenizers import byte_tokenizer

    other = tmp_path / "teacher-260"
    shutil.copytree(teacher, other)
    tokenizer = byte_tokenizer()
    tokenizer.add_tokens(["<|tool|>"])
    tokenizer.save_pretrained(other)
    result = invoke_in_process(*distill_args(other, data, tmp_path / "out"))
    _refused(result, tmp_path / "out", f"--data {data}: tokenized with another tokenizer (259 ids",
             "than the teacher's (260 ids")  # fmt: skip


def test_a_budget_too_small_for_the_stages_is_refused_before_any_work(tmp_path, teacher, data):
    result = invoke_in_process(*distill_args(teacher, data, tmp_path / "out", "4k"))
    _refused(result, tmp_path / "out", "--tokens 4,000: stage ild-mla gets 1 steps of 8 x 32 tokens (10% of the budget)",
             "pass --tokens 5,120 or more")  # fmt: skip


@pytest.mark.parametrize(
    "extra, culprit",
    [
        (["--no-calibrate", "--calibrate-steps", "5"], "--calibrate-steps with --no-calibrate"),
        (
            ["--calibrate-correct-residual", "0.5"],
            "--calibrate-correct-residual with --calibrate-teacher-forced (the default)",
        ),
        (["--calibrate-lr", "-1"], "--calibrate-lr -1.0: out of range"),
        (["--calibrate-schedule", "linear"], "--calibrate-schedule linear: out of range"),
        (["--calibrate-samples", "2", "--calibrate-batch", "4"], "--calibrate-batch 4: out of range"),
        (["--placement", "random"], "--placement random: unknown"),
        (["--kd-lr", "0"], "--kd-lr 0.0: out of range"),
        (["--calibrate-workers", "-1"], "--calibrate-workers -1: out of range"),
        (
            ["--calibrate-sequential", "--calibrate-workers", "2"],
            "--calibrate-workers 2 with --calibrate-sequential",
        ),
    ],
)
def test_bad_settings_are_refused_before_any_work(tmp_path, teacher, data, extra, culprit):
    """Each in one line naming the flag, before the first stage (a --placement that only the compose stage would
    have read, after the upcycles and ILD)."""
    result = invoke_in_process(*distill_args(teacher, data, tmp_path / "out", "6k", *extra))
    _refused(result, tmp_path / "out", culprit)
    assert len(result.output.strip().splitlines()) <= 2, result.output


def test_other_options_on_an_existing_folder_are_refused(pipeline, teacher, data):
    out, _ = pipeline
    result = invoke_in_process(*distill_args(teacher, data, out, "8k"))
    assert result.exit_code == 1 and "a pipeline started with other options (tokens differ" in result.output


def test_a_pipeline_continues_with_another_count_of_calibration_processes(pipeline, teacher, data):
    """--calibrate-workers changes how the layers are fitted, not what they become: a folder started with one
    count continues (here: finds every stage done) with another."""
    out, _ = pipeline
    before = json.loads((out / "stages.json").read_text())["stages"]
    result = invoke_in_process(*distill_args(teacher, data, out, "6k", "--calibrate-workers", "2"))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "stages.json").read_text())["stages"] == before


@pytest.mark.parametrize(
    "text, count", [("50M", 50_000_000), ("2.5m", 2_500_000), ("800k", 800_000), ("123", 123)]
)
def test_token_counts(text, count):
    from zebra.cli.distill import parse_tokens

    assert parse_tokens(text) == count


def test_an_upcycle_stage_reports_its_calibration_progress_to_the_view(tmp_path, teacher, data):
    """The calibration of an upcycle stage (minutes on a real teacher) reaches the view step by step: the CLI
    draws it as a bar per stage."""
    import contextlib

    from zebra.train.pipeline import PipelineOptions, PipelineView, plan_stages, run_upcycle

    calls = []

    class Recording(PipelineView):
        def stage_progress(self, stage):
            return contextlib.nullcontext(
                lambda done, total=None, note="": calls.append((stage.name, done, total))
            )

    o = PipelineOptions(teacher=str(teacher), data=data, tokens=6000, output=str(tmp_path / "out"), mixer="gdn",
                        calibrate_samples=2, calibrate_seq_len=32, calibrate_steps=2, device="cpu")  # fmt: skip
    stage = plan_stages(o)[1]
    result = run_upcycle(o, stage, Recording(), 0)
    assert stage.name == "upcycle-rec" and len(result["calibration"]["layers"]) == 4
    assert [c[1] for c in calls] == list(range(1, 9)) and {(c[0], c[2]) for c in calls} == {
        ("upcycle-rec", 8)
    }


def test_a_folder_started_before_an_option_existed_reads_it_as_its_default(tmp_path):
    """stages.json without a later option continues at that option's default, and is refused for another value."""
    import dataclasses

    from zebra.core.errors import ZebraError
    from zebra.train.pipeline import PipelineOptions, PipelineState

    o = PipelineOptions(teacher="t", data="d", tokens=1000, output=str(tmp_path))
    PipelineState(o).set("upcycle-mla", "done", {"export": "x"})
    older = json.loads((tmp_path / "stages.json").read_text())
    del older["options"]["calibrate_pass_through"], older["options"]["calibrate_lr"]
    (tmp_path / "stages.json").write_text(json.dumps(older))
    assert PipelineState(o).status("upcycle-mla") == "done"
    with pytest.raises(ZebraError, match=r"other options \(calibrate_lr differ"):
        PipelineState(dataclasses.replace(o, calibrate_lr=3e-3))


def test_by_default_the_calibrated_students_are_composed_and_kd_starts_at_lr_3e_4():
    """The defaults measured best (docs/benchmarks.md, issue 40): no ILD after calibration, KD at a peak LR that
    keeps the calibrated start; ILD stays one flag away (--ild-fraction 0.2, the published share)."""
    from zebra.train.pipeline import PipelineOptions, plan_stages

    stages = plan_stages(PipelineOptions(teacher="t", data="d", tokens=10**7, output="o"))
    assert [s.name for s in stages] == ["upcycle-mla", "upcycle-rec", "hybrid", "kd"]
    assert stages[-1].share == 1.0 and stages[-1].params["lr"] == 3e-4
    published = plan_stages(
        PipelineOptions(teacher="t", data="d", tokens=10**7, output="o", ild_fraction=0.2)
    )
    assert [s.name for s in published][2:4] == ["ild-mla", "ild-rec"]
