"""SMART's layer selection (a pure function) and scores, and `zebra upcycle --compose` with its bad inputs."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from zebra.core.errors import ZebraError
from zebra.upcycle.smart import smart_selection

from .teachers import tiny_llama
from .test_cli import assert_one_line_error, zebra


def feasible(layers: tuple[int, ...], num_layers: int) -> bool:
    """SMART's constraints: layer 0 and L-2 MLA, gaps floor or ceil of (L-2)/(N-1)."""
    n, last = len(layers), num_layers - 2
    gaps = {b - a for a, b in itertools.pairwise(layers)}
    return layers[0] == 0 and layers[-1] == last and gaps <= {last // (n - 1), math.ceil(last / (n - 1))}


@pytest.mark.parametrize(("num_layers", "published"), [(16, (0, 5, 10, 14)), (28, (0, 5, 10, 16, 21, 26)),
                                                      (32, (0, 4, 8, 12, 16, 20, 25, 30))])  # fmt: skip
def test_the_published_selections_are_feasible_and_chosen_when_they_score_best(num_layers, published):
    assert feasible(published, num_layers)
    scores = [1.0 if i in published else 0.0 for i in range(num_layers)]
    assert smart_selection(scores, len(published)) == published


def test_the_selection_is_the_best_feasible_one():
    rng = random.Random(0)
    for num_layers, count in [(10, 3), (12, 4), (16, 4), (9, 5)]:
        scores = [rng.uniform(-1, 1) for _ in range(num_layers)]
        got = smart_selection(scores, count)
        options = [c for c in itertools.combinations(range(num_layers), count) if feasible(c, num_layers)]
        best = max(sum(scores[i] for i in c) for c in options)
        assert feasible(got, num_layers)
        assert sum(scores[i] for i in got) == pytest.approx(best)


def test_forced_counts_and_too_many_layers():
    assert smart_selection([0.0] * 6, 0) == ()
    assert smart_selection([5.0] * 6, 1) == (0,)
    assert smart_selection([0.0] * 6, 5) == (0, 1, 2, 3, 4)
    with pytest.raises(ZebraError, match="--mla 7: must be between 0 and 6"):
        smart_selection([0.0] * 6, 7)


@pytest.fixture(scope="module")
def students(tmp_path_factory):
    """A 6-layer tiny teacher and its all-MLA and all-GDN students."""
    from zebra.upcycle import StudentOptions, upcycle

    root = tmp_path_factory.mktemp("compose")
    teacher = tiny_llama(root / "teacher", num_hidden_layers=6, seed=1)
    upcycle(str(teacher), root / "mla", StudentOptions(mixer="gdn", mla_layers="all"))
    upcycle(str(teacher), root / "rec", StudentOptions(mixer="gdn", mla=0))
    return root


def test_compose_takes_each_layer_from_the_matching_student(students, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "hybrid"
    result = zebra(
        "upcycle", "--compose", students / "mla", students / "rec", "--mla-layers", "0,4", "-o", out
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "upcycle.json").read_text())
    assert report["pattern"] == "*-G-G-G-*-G-" and report["placement"] == "explicit"
    assert report["layer_sources"] == [str(students / ("mla" if i in (0, 4) else "rec")) for i in range(6)]
    got = load_file(out / "model.safetensors")
    mla, rec = (
        load_file(students / "mla" / "model.safetensors"),
        load_file(students / "rec" / "model.safetensors"),
    )
    for name, tensor in got.items():
        if name.startswith("model.layers."):
            layer = int(name.split(".")[2]) // 2
            assert (tensor == (mla if layer in (0, 4) else rec)[name]).all(), name
    teacher = load_file(students / "teacher" / "model.safetensors")
    assert (got["model.norm.weight"] == teacher["model.norm.weight"]).all()


def test_compose_smart_stores_scores_and_a_chart(students, tmp_path):
    out = tmp_path / "smart"
    result = zebra("upcycle", "--compose", students / "mla", students / "rec", "--mla", "3", "--placement",
                   "smart", "--calibration", "@sample", "--calibration-samples", "4", "--seq-len", "32", "-o", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "upcycle.json").read_text())
    smart = report["smart"]
    assert len(smart["scores"]) == 6 and smart["sequences"] == 4
    for kl, score in zip(smart["kl"], smart["scores"], strict=True):
        assert score == pytest.approx(smart["baseline_kl"] - kl)
    assert tuple(report["mla_layers"]) == smart_selection(smart["scores"], 3)
    assert (out / "smart-scores.png").stat().st_size > 0 and "SMART" in result.stdout


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--mla", "7"], ["--mla 7: must be between 0 and 6"]),
        (
            ["--mla", "7", "--placement", "smart", "--calibration", "@sample"],
            ["--mla 7: must be between 0 and 6"],
        ),
        (["--mla", "2", "--placement", "smart"], ["--placement smart needs --calibration"]),
        ([], ["--compose needs one of --mla N and --mla-layers"]),
    ],
)
def test_compose_bad_counts_are_one_line_errors(students, tmp_path, extra, needles):
    result = zebra("upcycle", "--compose", students / "mla", students / "rec", "-o", tmp_path / "x", *extra)
    assert_one_line_error(result, *needles)


def test_compose_refuses_swapped_students_other_teachers_and_shapes(students, tmp_path):
    from zebra.upcycle import StudentOptions, upcycle

    swapped = zebra(
        "upcycle", "--compose", students / "rec", students / "mla", "--mla", "2", "-o", tmp_path / "x"
    )
    assert_one_line_error(swapped, "is not all-MLA")
    other = tiny_llama(tmp_path / "other", num_hidden_layers=6, seed=2)
    upcycle(str(other), tmp_path / "other-rec", StudentOptions(mixer="gdn", mla=0))
    result = zebra(
        "upcycle", "--compose", students / "mla", tmp_path / "other-rec", "--mla", "2", "-o", tmp_path / "y"
    )
    assert_one_line_error(result, "was upcycled from", str(other))
    wide = tiny_llama(tmp_path / "wide", num_hidden_layers=4, seed=1)
    upcycle(str(wide), tmp_path / "wide-rec", StudentOptions(mixer="gdn", mla=0))
    report = json.loads((tmp_path / "wide-rec" / "upcycle.json").read_text())
    report["teacher"] = str(students / "teacher")  # same teacher on paper, another shape
    (tmp_path / "wide-rec" / "upcycle.json").write_text(json.dumps(report))
    result = zebra(
        "upcycle", "--compose", students / "mla", tmp_path / "wide-rec", "--mla", "2", "-o", tmp_path / "z"
    )
    assert_one_line_error(result, "num_hidden_layers is 12", "but 8")


def test_smart_refuses_calibration_data_in_another_tokenizer(students, tmp_path, smollm2_4layer_dir):
    """Data prepared with SmolLM2's tokenizer against a byte-tokenizer teacher."""
    from zebra.data.prep import plan_prep, run_prep
    from zebra.data.text_sources import open_source

    text = tmp_path / "t.jsonl"
    text.write_text("\n".join(json.dumps({"text": f"hello world {i} " * 20}) for i in range(20)))
    folder = tmp_path / "smol-tokens"
    run_prep(plan_prep(open_source(str(text)), folder, tokenizer=str(smollm2_4layer_dir), workers=1))
    result = zebra("upcycle", "--compose", students / "mla", students / "rec", "--mla", "3", "--placement", "smart",
                   "--calibration", folder, "-o", tmp_path / "x")  # fmt: skip
    assert_one_line_error(result, "tokenized with another tokenizer")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        ([], ["pass a TEACHER or --compose MLA_DIR RECURRENT_DIR"]),
        (["TEACHER", "--compose", "a", "b"], ["pass a TEACHER or --compose MLA_DIR RECURRENT_DIR"]),
        (["TEACHER", "--placement", "smart"], ["--placement smart needs --compose"]),
    ],
)
def test_teacher_or_compose_one_line_errors(students, tmp_path, args, needles):
    args = [students / "teacher" if a == "TEACHER" else a for a in args]
    assert_one_line_error(zebra("upcycle", *args, "-o", tmp_path / "x"), *needles)


def test_mla_layers_all_makes_the_all_mla_student(students):
    report = json.loads((students / "mla" / "upcycle.json").read_text())
    assert report["pattern"] == "*-" * 6 and report["mla_layers"] == list(range(6))
    assert json.loads((students / "rec" / "upcycle.json").read_text())["pattern"] == "G-" * 6


def test_compose_refuses_an_export_without_upcycle_json(students, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(students / "rec", bare)
    (bare / "upcycle.json").unlink()
    result = zebra("upcycle", "--compose", students / "mla", bare, "--mla", "2", "-o", tmp_path / "x")
    assert_one_line_error(result, "no upcycle.json, so its teacher is unknown")
