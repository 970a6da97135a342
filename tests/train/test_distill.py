"""`zebra train --init DIR --teacher T`: a tiny random Llama teacher (byte tokenizer) upcycled by `zebra upcycle`
into a tiny hybrid student, then distilled on the bundled corpus, on one rank and on two gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from tests.upcycle.teachers import tiny_llama

from zebra.train.checkpoint import read_meta

from .helpers import (
    distil,
    invoke_in_process,
    logged_step,
    losses,
    records,
    sets,
    upcycled_student,
    wait_for,
    zebra_process,
)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("teacher") / "llama", seed=3)


@pytest.fixture(scope="module")
def student(tmp_path_factory, teacher) -> Path:
    return upcycled_student(tmp_path_factory.mktemp("student") / "gdn", teacher, mla=1)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, sample_prefix, teacher, student):
    out = tmp_path_factory.mktemp("runs")
    distil(invoke_in_process, sample_prefix, out, "one", teacher, student, steps=8)
    return out / "one"


def test_distillation_logs_kl_and_both_ces_and_lowers_the_kl(one_rank, teacher, student):
    train = [r for r in records(one_rank) if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 9))
    for r in train:  # kl_weight 1, ce_weight 0, temperature 1: the loss is the KL
        assert r["loss"] == pytest.approx(r["kl"], rel=1e-5)
        assert r["kl"] >= 0 and r["ce"] > 0 and r["teacher_ce"] > 0
    assert train[-1]["kl"] < 0.7 * train[0]["kl"]
    config = yaml.safe_load((one_rank / "config.yaml").read_text())
    assert config["distill"]["teacher"] == str(teacher.resolve())
    assert config["train"]["init"] == str(student.resolve())
    assert config["model"]["pattern"] == json.loads((student / "config.json").read_text())["layer_pattern"]
    assert (one_rank / "loss.png").stat().st_size > 0


def test_the_student_starts_from_the_init_export(cli, tmp_path, sample_prefix, teacher, student):
    """At learning rate 0 the run's export is the init export, tensor for tensor."""
    from safetensors.torch import load_file

    distil(cli, sample_prefix, tmp_path, "lr0", teacher, student, *sets("train.lr=0", "train.min_lr=0",
           "train.export=true"), steps=1)  # fmt: skip
    got, want = (
        load_file(tmp_path / "lr0" / "export" / "model.safetensors"),
        load_file(student / "model.safetensors"),
    )
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_an_init_export_of_another_shape_is_refused_naming_the_key(
    cli, tmp_path, sample_prefix, teacher, student
):
    result = cli("train", "tiny", "--data", sample_prefix, "--init", str(student), "--teacher", str(teacher),
                 "--output", str(tmp_path), *sets("model.intermediate_size=64"), "--max-steps", "1")  # fmt: skip
    assert result.exit_code != 0
    assert "train.init" in result.output and "mixer.gate_proj.weight is [96, 64]" in result.output


def test_sigterm_saves_and_the_resume_takes_the_checkpoint_not_the_init_export(
    cli, tmp_path, sample_prefix, teacher, student
):
    import shutil
    import signal

    from zebra.train.checkpoint import committed

    init, run = tmp_path / "init", tmp_path / "term"
    shutil.copytree(student, init)
    args = ["train", "tiny", "--data", sample_prefix, "--init", str(init), "--teacher", str(teacher),
            "--output", str(tmp_path), "--run", "term", *sets()]  # fmt: skip
    proc = zebra_process(*args, "--max-steps", "500")
    wait_for(lambda: logged_step(run) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "stopped by SIGTERM" in out, err
    step = read_meta(committed(run / "checkpoints")[0])["step"]
    (init / "model.safetensors").unlink()  # the resume must not read it
    result = cli(*args, "--max-steps", str(step + 2))
    assert result.exit_code == 0, result.output
    assert "resumed from" in result.output
    assert sorted(losses(run)) == list(range(1, step + 3))


def test_two_ranks_ddp_and_fsdp_match_one_rank(cli, tmp_path, sample_prefix, teacher, student, one_rank):
    for parallel in ("ddp", "fsdp"):
        distil(cli, sample_prefix, tmp_path, parallel, teacher, student, "--nproc", "2",
               "--set", f"train.parallel={parallel}", steps=8)  # fmt: skip
        run = tmp_path / parallel
        assert read_meta(run / "checkpoints" / "step_0000008")["parallel"] == parallel
        got, want = records(run), records(one_rank)
        for a, b in zip([r for r in got if "kl" in r], [r for r in want if "kl" in r], strict=True):
            for key in ("kl", "ce", "teacher_ce"):
                assert a[key] == pytest.approx(b[key], rel=1e-4), (parallel, a["step"], key)


def test_a_teacher_with_another_vocabulary_is_refused(cli, tmp_path, sample_prefix, student):
    other = tiny_llama(tmp_path / "big-vocab", vocab_size=320)
    result = cli("train", "tiny", "--data", sample_prefix, "--init", str(student), "--teacher", str(other),
                 "--output", str(tmp_path), "--max-steps", "1")  # fmt: skip
    assert result.exit_code != 0
    assert "320 logits per token" in result.output and "model.vocab_size 272" in result.output


def test_a_teacher_with_another_tokenizer_is_refused(cli, tmp_path, sample_prefix, teacher, student):
    import shutil

    from zebra.data.tokenizers import byte_tokenizer

    other = tmp_path / "other-tokenizer"
    shutil.copytree(teacher, other)
    tokenizer = byte_tokenizer()
    tokenizer.add_tokens(["<|tool|>"])  # same model, a tokenizer with one more id
    tokenizer.save_pretrained(other)
    result = cli("train", "tiny", "--data", sample_prefix, "--init", str(student), "--teacher", str(other),
                 "--output", str(tmp_path), "--max-steps", "1")  # fmt: skip
    assert result.exit_code != 0
    assert "its tokenizer (260 ids" in result.output and "data.tokenizer byte (259 ids" in result.output


def test_init_without_a_teacher_refuses_data_of_another_tokenizer(cli, tmp_path, student):
    """--init without --teacher trained an export's embeddings on another tokenizer's ids, and the run's export
    then shipped that tokenizer beside them."""
    from zebra.data.tokenizers import byte_tokenizer

    other = tmp_path / "other-tokenizer"
    tokenizer = byte_tokenizer()
    tokenizer.add_tokens(["<|tool|>"])  # one more id than the export's byte tokenizer
    tokenizer.save_pretrained(other)
    result = cli("train", "tiny", "--mock-data", "--init", str(student), "--set", f"data.tokenizer={other}",
                 "--output", str(tmp_path / "runs"), "--max-steps", "1")  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"train.init {student.resolve()}: its tokenizer (259 ids" in result.output
    assert f"data.tokenizer {other} (260 ids" in result.output
    assert not (tmp_path / "runs").exists()


def test_init_names_a_missing_folder_and_a_run_folder_for_what_they_are(tmp_path, monkeypatch):
    """Both used to say 'config.json unreadable (FileNotFoundError)'."""
    from zebra.core.errors import ZebraError
    from zebra.train.init_weights import init_overrides

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ZebraError, match=r"--init nope: no such folder"):
        init_overrides("nope")
    run = Path("runs/tiny-gdn")
    (run / "export").mkdir(parents=True)
    (run / "config.yaml").write_text("name: tiny\n")
    with pytest.raises(ZebraError, match=r"--init runs/tiny-gdn: a training run folder") as caught:
        init_overrides("runs/tiny-gdn")
    assert (
        caught.value.fix
        == "export its latest checkpoint first: zebra convert runs/tiny-gdn, then --init runs/tiny-gdn/export"
    )
    (run / "export" / "config.json").write_text("{}")
    with pytest.raises(ZebraError) as caught:
        init_overrides("runs/tiny-gdn")
    assert caught.value.fix == "did you mean --init runs/tiny-gdn/export"


def test_a_hub_teacher_goes_up_to_the_network_offline(cli, tmp_path, sample_prefix, student, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = cli("train", "tiny", "--data", sample_prefix, "--init", str(student),
                 "--teacher", "zebra-tests/no-such-teacher", "--output", str(tmp_path), "--max-steps", "1")  # fmt: skip
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert (
        "zebra-tests/no-such-teacher: no such local folder, and the hub id is not available" in result.output
    )
