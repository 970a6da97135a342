"""`distill.stage: ild`: teacher-forced intermediate-layer distillation of tiny upcycled students, on one rank and
two gloo ranks, with resume; its loss against a reference computed from the teacher's HF hidden states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.upcycle.teachers import tiny_llama

from .helpers import distil, invoke_in_process, losses, sets, train_records, upcycled_student


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("teacher") / "llama", num_hidden_layers=4, seed=3)


@pytest.fixture(scope="module")
def student(tmp_path_factory, teacher) -> Path:
    return upcycled_student(tmp_path_factory.mktemp("student") / "gdn", teacher, mla=0)


# Teacher-forced ILD, a log line per step and an export at the end.
ILD = ("distill.stage=ild", "train.log_interval=1", "train.eval_interval=0", "train.export=true")


def _ild(cli, data, out, run, teacher, student, *extra, steps=6):
    return distil(cli, data, out, run, teacher, student, *extra, steps=steps, stage=ILD)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, sample_prefix, teacher, student):
    out = tmp_path_factory.mktemp("runs")
    _ild(invoke_in_process, sample_prefix, out, "one", teacher, student, steps=6)
    return out / "one"


def test_ild_lowers_the_layer_distances_and_the_export_keeps_the_provenance(one_rank, student):
    train = train_records(one_rank)
    assert [r["step"] for r in train] == list(range(1, 7))
    for r in train:
        groups = sum(v for k, v in r.items() if k.startswith("layers_"))
        assert r["loss"] == pytest.approx(r["hidden"] + r["mixer"], rel=1e-4)
        assert groups == pytest.approx(r["loss"], rel=1e-4)
    assert train[-1]["loss"] < 0.8 * train[0]["loss"]
    assert json.loads((one_rank / "export" / "upcycle.json").read_text()) == json.loads(
        (student / "upcycle.json").read_text()
    )


def test_the_loss_matches_a_reference_from_the_teachers_hidden_states(teacher, student):
    """The `hidden` part against each student layer run by hand on HF's `output_hidden_states`."""
    from transformers import AutoModelForCausalLM

    from zebra.models import ZebraForCausalLM
    from zebra.train.ild import ILDLoss

    t = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float64).eval()
    s = ZebraForCausalLM.from_pretrained(student, dtype=torch.float64)
    tokens = torch.randint(0, 272, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 16)
    mask[0, :3] = 0
    loss, sums = ILDLoss(t, 4)(s, tokens, tokens, mask)
    hs = t(
        input_ids=tokens, output_hidden_states=True
    ).hidden_states  # embeddings, 4 layer outputs (last normed)
    want = torch.zeros((), dtype=torch.float64)
    pos = torch.arange(16)[None]
    with torch.no_grad():
        for i in range(4):
            x = hs[i]
            mixer, mlp = s.model.layers[2 * i], s.model.layers[2 * i + 1]
            y = x + mixer.mixer(mixer.norm(x), position_ids=pos)
            h = y + mlp.mixer(mlp.norm(y))
            h = s.model.norm(h) if i == 3 else h
            want += ((h - hs[i + 1]).norm(dim=-1) * mask).sum()
    assert sums[0].item() == pytest.approx(want.item(), rel=1e-4)
    assert loss.item() > sums[0].item()  # plus the mixer distances


def test_mse_is_the_other_norm(cli, tmp_path, sample_prefix, teacher, student, one_rank):
    _ild(cli, sample_prefix, tmp_path, "mse", teacher, student, *sets("distill.ild_norm=mse"), steps=1)
    mse, l2 = train_records(tmp_path / "mse")[0], train_records(one_rank)[0]
    assert 0 < mse["loss"] < l2["loss"]  # mean of squares per channel vs the norm per token


def test_resume_continues_the_ild_run(cli, tmp_path, sample_prefix, teacher, student):
    _ild(cli, sample_prefix, tmp_path, "r", teacher, student, steps=3)
    result = _ild(cli, sample_prefix, tmp_path, "r", teacher, student, steps=6)
    assert "resumed from" in result.output
    got = losses(tmp_path / "r")  # the schedule follows max_steps, so steps 4-6 differ from one_rank's
    assert sorted(got) == list(range(1, 7))
    assert got[6] < got[1]


def test_two_ranks_ddp_and_fsdp_match_one_rank(cli, tmp_path, sample_prefix, teacher, student, one_rank):
    for parallel in ("ddp", "fsdp"):
        _ild(cli, sample_prefix, tmp_path, parallel, teacher, student, "--nproc", "2",
             "--set", f"train.parallel={parallel}", steps=6)  # fmt: skip
        got, want = train_records(tmp_path / parallel), train_records(one_rank)
        for a, b in zip(got, want, strict=True):
            for key in ("hidden", "mixer"):
                assert a[key] == pytest.approx(b[key], rel=1e-3), (parallel, a["step"], key)


def test_a_student_that_is_not_one_pair_per_teacher_layer_is_refused(cli, tmp_path, sample_prefix, teacher):
    result = cli("train", "tiny", "--data", sample_prefix, "--teacher", str(teacher), "--output", str(tmp_path),
                 "--max-steps", "1", *sets("distill.stage=ild", "model.vocab_size=272", "model.pattern=*-M-G-",
                                           "model.num_layers=6"))  # fmt: skip
    assert result.exit_code != 0
    assert "distill.stage ild" in result.output and "not one mixer/MLP pair per layer" in result.output
