"""Distillation options for spending tokens well: the new mixers and the copied weights at their own learning
rates (and the mixers alone first), ILD of the mixers alone, the top-k KL and its on-disk teacher logit cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tests.upcycle.teachers import tiny_llama

from .helpers import distil, losses, sets, upcycled_student


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("teacher") / "llama", num_hidden_layers=4, seed=3)


@pytest.fixture(scope="module")
def student(tmp_path_factory, teacher) -> Path:
    return upcycled_student(tmp_path_factory.mktemp("student") / "gdn", teacher, mla=1)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def _changed(before: dict, after: dict) -> set[str]:
    return {name for name in before if not torch.equal(before[name], after[name])}


def _mixer_names(weights: dict, student: Path) -> set[str]:
    """The tensors of the mixers upcycle.json says were made (not copied) for this student."""
    report = json.loads((student / "upcycle.json").read_text())
    made = {
        t["name"].split(".mixer.")[0]
        for t in report["tensors"]
        if ".mixer." in t["name"] and t["how"] != "copied"
    }
    return {n for n in weights if ".mixer." in n and n.split(".mixer.")[0] in made}


def test_new_mixers_are_read_from_upcycle_json_also_through_a_composed_hybrid(tmp_path, teacher, student):
    from zebra.train.param_roles import new_mixer_sublayers, role
    from zebra.upcycle.compose import compose

    assert new_mixer_sublayers(student) == {0, 2, 4, 6}  # every mixer sublayer of the 4-layer student
    rec = upcycled_student(tmp_path / "rec", teacher, mla=0)
    mla = tmp_path / "mla"
    from zebra.upcycle import StudentOptions, upcycle

    upcycle(str(teacher), mla, StudentOptions(mixer="gdn", mla_layers="all"), seed=5)
    hybrid = compose(mla, rec, tmp_path / "hybrid", mla=2)
    assert {t.how for t in hybrid.tensors} == {"copied"}  # composed: each tensor copied from a student...
    assert new_mixer_sublayers(tmp_path / "hybrid") == {0, 2, 4, 6}  # ...whose own record says what was made
    assert role("module.model.layers.2.mixer.q_proj.weight", frozenset({2})) == "mixer"
    assert role("model.layers.2.norm.weight", frozenset({2})) == "copied"
    assert role("model.layers.3.mixer.up_proj.weight", frozenset({2})) == "copied"


def test_mixer_only_steps_leave_the_copied_weights_unchanged_then_train_them_at_their_scale(
    cli, tmp_path, sample_prefix, teacher, student
):
    """2 steps of the mixers alone: only the new mixers move; 2 more at copied_lr_scale: the rest moves too, by
    far less than the mixers; the logged lr is the mixers'."""
    extra = sets("train.export=true", "distill.mixer_only_steps=2", "distill.copied_lr_scale=0.05")
    before = _weights(student)
    distil(cli, sample_prefix, tmp_path, "warm", teacher, student, *extra, steps=2)
    after = _weights(tmp_path / "warm" / "export")
    mixers = _mixer_names(before, student)
    assert _changed(before, after) == mixers
    distil(cli, sample_prefix, tmp_path, "both", teacher, student, *extra, steps=4)
    later = _weights(tmp_path / "both" / "export")
    assert _changed(before, later) == set(before)  # after step 2, everything trains

    def moved(names):
        return max((later[n].float() - before[n].float()).abs().max().item() for n in names)

    assert moved(set(before) - mixers) < 0.2 * moved(mixers)


def test_ild_of_the_mixers_alone_freezes_mlps_norms_and_embeddings(
    cli, tmp_path, sample_prefix, teacher, student
):
    distil(cli, sample_prefix, tmp_path, "ild", teacher, student, steps=6,
           stage=("distill.stage=ild", "distill.ild_params=mixers", "train.export=true"))  # fmt: skip
    before, after = _weights(student), _weights(tmp_path / "ild" / "export")
    assert _changed(before, after) == _mixer_names(before, student)
    assert losses(tmp_path / "ild")[6] < 0.9 * losses(tmp_path / "ild")[1]


def test_copied_lr_without_an_upcycled_init_is_refused_in_one_line(
    cli, tmp_path, sample_prefix, teacher, student
):
    plain = tmp_path / "plain"
    shutil.copytree(student, plain)
    (plain / "upcycle.json").unlink()
    result = cli("train", "tiny", "--data", sample_prefix, "--init", str(plain), "--teacher", str(teacher),
                 "--output", str(tmp_path / "runs"), "--max-steps", "1", *sets("distill.copied_lr_scale=0.1"))  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "no upcycle.json, so the new mixers are not known" in result.output
    assert not (tmp_path / "runs").exists()


def test_the_logit_cache_is_reused_gives_the_uncached_loss_and_refuses_other_data(
    cli, tmp_path, sample_prefix, teacher, student
):
    """Epochs over few sequences: the second pass reads every sequence back; the losses equal those of a run
    without the cache; a cache of another k (or data) is refused before the run starts."""
    cache = tmp_path / "cache"
    few = ("data.split=1,1,0", "train.seed=7")  # the same sequences again each epoch
    top = ("distill.top_k=16", *few)
    plain = distil(cli, sample_prefix, tmp_path, "plain", teacher, student, *sets(*top), steps=4)
    cached = distil(cli, sample_prefix, tmp_path, "cached", teacher, student,
                    *sets(*top, f"distill.logit_cache={cache}"), steps=4)  # fmt: skip
    assert "sequences read back" in cached.output and "Traceback" not in plain.output
    assert losses(tmp_path / "cached") == pytest.approx(losses(tmp_path / "plain"), rel=1e-6)
    again = distil(cli, sample_prefix, tmp_path, "again", teacher, student,
                   *sets(*top, f"distill.logit_cache={cache}"), steps=4)  # fmt: skip
    assert ": 32 sequences read back, 0 from the teacher" in again.output
    assert losses(tmp_path / "again") == pytest.approx(losses(tmp_path / "plain"), rel=1e-6)
    stale = cli("train", "tiny", "--data", sample_prefix, "--init", str(student), "--teacher", str(teacher),
                "--output", str(tmp_path / "runs"), "--max-steps", "1",
                *sets("distill.top_k=8", *few, f"distill.logit_cache={cache}"))  # fmt: skip
    assert stale.exit_code == 1 and "Traceback" not in stale.output
    assert f"distill.logit_cache {cache}: made for another top_k than this run's" in stale.output
