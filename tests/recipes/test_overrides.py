"""`--set KEY=VALUE`: coercion to the field's type, nested keys, null, and one-line errors naming --set."""

from __future__ import annotations

import pytest

from zebra.core.errors import ZebraError
from zebra.recipes import load_recipe


def load(*overrides):
    return load_recipe("tiny", overrides=list(overrides))


@pytest.mark.parametrize(
    ("assignment", "get", "value"),
    [
        ("train.max_steps=1000", lambda r: r.train.max_steps, 1000),
        ("train.lr=3e-4", lambda r: r.train.lr, 3e-4),
        ("train.clip_grad=2", lambda r: r.train.clip_grad, 2.0),
        ("train.compile=true", lambda r: r.train.compile, True),
        ("train.compile=off", lambda r: r.train.compile, False),
        ("train.export=0", lambda r: r.train.export, False),
        ("data.tokenizer=fla-hub/gla-1.3B-100B", lambda r: r.data.tokenizer, "fla-hub/gla-1.3B-100B"),
        ("data.paths=a,b:0.5", lambda r: r.data.paths, [("a", 1.0), ("b", 0.5)]),  # DataPaths, parsed once
        ("data.paths=[x, y]", lambda r: list(map(str, r.data.paths)), ["x", "y"]),
        ("data.paths=", lambda r: r.data.paths, []),
        ("model.mla.num_heads=8", lambda r: r.model.mla.num_heads, 8),
        ("launch.launcher=slurm", lambda r: r.launch.launcher, "slurm"),
        ("description=a b = c", lambda r: r.description, "a b = c"),
    ],
)
def test_values_are_coerced_to_the_field_type(assignment, get, value):
    result = get(load(assignment))
    assert result == value and type(result) is type(value)


def test_later_override_wins():
    assert load("train.lr=1e-3", "train.lr=2e-3").train.lr == 2e-3


def test_null_for_an_optional_field():
    recipe = load("model.pattern=null", "model.num_layers=4")
    assert recipe.model.pattern is None
    assert load("model.pattern=none", "model.num_layers=4").model.pattern is None


def test_null_for_a_required_field_is_an_error():
    with pytest.raises(ZebraError, match=r"^--set: train.max_steps: got 'null' \(expected an integer\)$"):
        load("train.max_steps=null")


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("train.lrr=1", r"--set: train.lrr: unknown key \(did you mean 'lr'\?\)"),
        ("trian.lr=1", r"--set: trian: unknown key \(did you mean 'train'\?\)"),
        ("model.mla.num_head=8", r"--set: model.mla.num_head: unknown key \(did you mean 'num_heads'\?\)"),
        ("train.max_steps=abc", r"--set: train.max_steps: got 'abc' \(expected an integer\)"),
        ("data.paths=[a, b", r"--set: data.paths: got '\[a, b' \(unbalanced brackets"),
        ("train.max_steps=1.5", r"--set: train.max_steps: got '1.5' \(expected an integer\)"),
        ("train.lr=fast", r"--set: train.lr: got 'fast' \(expected a number\)"),
        ("train.lr=inf", r"--set: train.lr: got inf \(expected a finite number\)"),
        ("train.compile=maybe", r"--set: train.compile: got 'maybe' \(expected true or false\)"),
        ("train.lr=2", r"--set: train.lr: 2.0 is above the maximum \(expected <= 1.0\)"),
        ("train.max_steps=0", r"--set: train.max_steps: 0 is below the minimum \(expected >= 1\)"),
        (
            "train.precision=bf15",
            r"--set: train.precision: got 'bf15' \(expected one of bf16, fp32; did you mean 'bf16'\?\)",
        ),
        ("train=3", r"--set: train: got '3' \(expected a mapping\)"),
        ("train.lr.x=1", r"--set 'train.lr.x=1': lr is not a section"),
        ("train.lr", r"--set 'train.lr': expected KEY=VALUE"),
        ("=3", r"--set '=3': expected KEY=VALUE"),
        ("train..lr=1", r"--set 'train..lr=1': empty part in key"),
    ],
)
def test_bad_overrides_are_one_line_errors_naming_set(assignment, message):
    with pytest.raises(ZebraError, match=f"^{message}") as err:
        load(assignment)
    assert "\n" not in err.value.message


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        (["train.min_lr=0.5"], "train.min_lr: 0.5 exceeds train.lr"),
        (["train.lr=1e-5"], "train.min_lr: 0.0003 exceeds train.lr 1e-05"),  # the other key of the rule
        (["train.micro_batch_size=100"], "train.micro_batch_size: 100 exceeds global_batch_size 8"),
        (["model.pattern=XYZ"], "model.pattern: layer pattern 'XYZ' has unknown characters"),
        (["model.num_layers=4"], "model.pattern: '*-M-G-K-' has 8 sublayers but model.num_layers is 4"),
        (["model.gdn.num_v_heads=3"], "model.gdn.num_v_heads: 3 is not a multiple of num_heads 2"),
        (["data.split=1,2"], "data.split: '1,2' (expected three"),
        (["data.paths=a:-1"], "data.paths: 'a:-1': weight '-1' is not a positive number"),
    ],
)
def test_override_is_checked_against_cross_field_rules_naming_set(assignments, message):
    with pytest.raises(ZebraError) as err:
        load(*assignments)
    assert err.value.message.startswith(f"--set: {message}"), err.value.message


def test_a_cross_field_error_of_the_file_names_the_file_despite_other_overrides(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("extends: tiny\ntrain: {lr: 1.0e-3, min_lr: 1.0e-2}\n")
    with pytest.raises(ZebraError) as err:
        load_recipe(path, overrides=["train.max_steps=5", "model.hidden_size=64"])
    assert err.value.message.startswith(f"{path}: train.min_lr: 0.01 exceeds train.lr 0.001")


@pytest.mark.parametrize("name", ["tiny", "tiny-mamba", "1b-kda-mla", "8b-mamba-mla"])
def test_an_exports_config_gives_back_the_recipes_model(name):
    """`zebra train --init DIR` sets model.* from DIR/config.json: the inverse of ModelSpec.flat."""
    from zebra.recipes.schema import ModelSpec
    from zebra.spec import arch

    original = load_recipe(name).model
    config = original.to_config().to_dict()
    rebuilt = load_recipe("tiny-kda", overrides=ModelSpec.overrides_from_config(config)).model
    a, b = original.flat(), rebuilt.flat()
    assert arch.resolve_pattern(arch.as_config(a)) == arch.resolve_pattern(arch.as_config(b))
    ignored = {"layer_pattern", "hybrid_attention_ratio", "rope_scaling"}  # the pattern comes resolved
    assert {k: v for k, v in a.items() if k not in ignored} == {
        k: v for k, v in b.items() if k not in ignored
    }
