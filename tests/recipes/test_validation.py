"""Every validation error of the loader: `FILE: key.path: problem (expected ...)`, one line, no traceback."""

from __future__ import annotations

import re

import pytest

from zebra.core.errors import ZebraError
from zebra.recipes import find_recipe, load_recipe


def error_of(write, text: str, name: str = "bad.yaml") -> str:
    path = write(name, text)
    with pytest.raises(ZebraError) as err:
        load_recipe(path)
    message = err.value.message
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message.removeprefix(f"{path}: ")


def test_invalid_yaml_reports_the_line(write):
    """The line where the broken construct starts (the flow mapping left open), not the end of the file where
    the parser noticed; the same words as a broken task YAML of `zebra eval`."""
    message = error_of(write, "model:\n  hidden_size: 64\n  mla: {num_heads: 4\n")
    assert re.fullmatch(r"line \d: not valid YAML \(.+\)", message)
    assert message.startswith("line 3: not valid YAML (while parsing a flow mapping, expected ',' or '}'")


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", 3, "lr"),
        ("train: {}\nmodel: {}\ntrain: {lr: 1.0}\n", 3, "train"),
    ],
)
def test_a_key_given_twice_is_refused_with_its_line(write, text, line, key):
    """Plain YAML keeps the last of two equal keys silently: the recipe would train with a value its reader
    may not see. One line names the key and the line of its second use."""
    assert error_of(write, text) == f"line {line}: not valid YAML ({key!r} is given twice)"


def test_a_recipe_must_be_a_mapping(write):
    assert error_of(write, "- model\n- train\n").startswith("a recipe must be a mapping of sections")


def test_an_empty_file_is_all_defaults(write):
    recipe = load_recipe(write("empty.yaml", ""))
    assert recipe.name == "empty" and recipe.model.num_layers == 32


def test_non_utf8_file(write, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("description: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ZebraError, match="cannot read the recipe"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trian: {lr: 1.0}\n", "trian: unknown key (did you mean 'train'?)"),
        ("model: {hiden_size: 64}\n", "model.hiden_size: unknown key (did you mean 'hidden_size'?)"),
        ("model: {mla: {zzz: 1}}\n", "model.mla.zzz: unknown key (known keys: num_heads, q_lora_rank"),
        ("model: 5\n", "model: got 5 (expected a mapping)"),
        ("train: {max_steps: ten}\n", "train.max_steps: got 'ten' (expected an integer)"),
        ("train: {max_steps: 10.5}\n", "train.max_steps: got 10.5 (expected an integer)"),
        ("train: {max_steps: true}\n", "train.max_steps: got True (expected an integer)"),
        ("train: {lr: fast}\n", "train.lr: got 'fast' (expected a number)"),
        ("train: {lr: .nan}\n", "train.lr: got nan (expected a finite number)"),
        ("train: {compile: 1}\n", "train.compile: got 1 (expected true or false)"),
        ("data: {tokenizer: 7}\n", "data.tokenizer: got 7 (expected a string; quote it in YAML)"),
        ("data: {paths: a}\n", "data.paths: got 'a' (expected a list of strings)"),
        ("data: {paths: [1, 2]}\n", "data.paths: got [1, 2] (expected a list of strings)"),
        ("model: {pattern: 5}\n", "model.pattern: got 5 (expected a string; quote it in YAML)"),
        (
            "train: {lr_decay_style: cosin}\n",
            "train.lr_decay_style: got 'cosin' (expected one of cosine, linear, constant; did you mean 'cosine'?)",
        ),
        (
            "model: {recurrent_type: mamba}\n",
            "model.recurrent_type: got 'mamba' (expected one of mamba2, gdn, kda, gla; did you mean 'mamba2'?)",
        ),
        ("train: {lr: 1.5}\n", "train.lr: 1.5 is above the maximum (expected <= 1.0)"),
        ("train: {warmup_steps: -1}\n", "train.warmup_steps: -1 is below the minimum (expected >= 0)"),
        ("model: {gdn: {conv_size: 9}}\n", "model.gdn.conv_size: 9 is above the maximum (expected <= 8)"),
        (
            "model: {hybrid_attention_ratio: 1.5}\n",
            "model.hybrid_attention_ratio: 1.5 is above the maximum (expected <= 1.0)",
        ),
    ],
)
def test_field_errors(write, text, expected):
    assert error_of(write, text).startswith(expected)


def base(extra: str) -> str:
    """tiny with `extra` merged in (tiny's pattern dropped when `extra` sets model fields that need it)."""
    return "extends: tiny\n" + extra


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            base("model: {pattern: '*-X-', num_layers: 4}\n"),
            "model.pattern: layer pattern '*-X-' has unknown characters ['X']",
        ),
        (
            base("model: {pattern: '*G-', num_layers: 3}\n"),
            "model.pattern: layer pattern '*G-': mixer '*' at sublayer 0 is not followed by an MLP '-'",
        ),
        (
            base("model: {pattern: '*-G-'}\n"),
            "model.pattern: '*-G-' has 4 sublayers but model.num_layers is 8 (expected one character per sublayer)",
        ),
        (
            base("model: {pattern: null, num_layers: 7}\n"),
            "model.num_layers: 7 is odd (expected an even count",
        ),
        (
            base("model: {gdn: {num_heads: 3, num_v_heads: 4}}\n"),
            "model.gdn.num_v_heads: 4 is not a multiple of num_heads 3",
        ),
        (
            base("model: {mamba: {head_dim: 48}}\n"),
            "model.mamba.head_dim: expand*hidden_size 64 is not divisible by 48",
        ),
        (
            base("model: {mamba: {num_groups: 3}}\n"),
            "model.mamba.num_groups: 4 heads do not split into 3 groups (expected a divisor of the head count)",
        ),
        (
            base("model: {mla: {qk_rope_head_dim: 15}}\n"),
            "model.mla.qk_rope_head_dim: 15 is odd (expected an even count for RoPE)",
        ),
        (
            base("train: {lr: 1.0e-3, min_lr: 1.0e-2}\n"),
            "train.min_lr: 0.01 exceeds train.lr 0.001 (expected min_lr <= lr)",
        ),
        (base("train: {micro_batch_size: 32}\n"), "train.micro_batch_size: 32 exceeds global_batch_size 8"),
        (
            base("data: {paths: ['a:x']}\n"),
            "data.paths: 'a:x': weight 'x' is not a positive number (expected PREFIX[:weight])",
        ),
        (base("data: {paths: ['a:0']}\n"), "data.paths: 'a:0': weight '0' is not a positive number"),
        (base("data: {paths: [':2']}\n"), "data.paths: ':2': empty prefix (expected PREFIX[:weight])"),
        (
            base("data: {split: '99,1'}\n"),
            "data.split: '99,1' (expected three non-negative weights like '99,1,0')",
        ),
        (base("data: {split: '99,-1,0'}\n"), "data.split: '99,-1,0' (expected three"),
        (base("data: {split: 'a,b,c'}\n"), "data.split: 'a,b,c' (expected three"),
        (base("data: {split: '0,0,0'}\n"), "data.split: '0,0,0' (expected three"),
    ],
)
def test_cross_field_rules(write, text, expected):
    assert error_of(write, text).startswith(expected)


def test_rules_apply_only_to_mixers_in_the_pattern(write):
    # A pure-GDN recipe is not held to Mamba's divisibility rule.
    recipe = load_recipe(
        write("gdn.yaml", base("model: {pattern: 'G-G-', num_layers: 4, mamba: {num_groups: 3}}\n"))
    )
    assert recipe.model.mamba.num_groups == 3


def test_weighted_paths_and_split_that_are_valid(write):
    recipe = load_recipe(write("ok.yaml", base("data: {paths: ['a:0.3', 'b:0.7', c], split: '98,2,0'}\n")))
    assert recipe.data.paths == [("a", 0.3), ("b", 0.7), ("c", 1.0)]


def test_unknown_name_suggests_close_builtins():
    with pytest.raises(ZebraError) as err:
        find_recipe("1b-mamba")
    assert err.value.message == "unknown recipe '1b-mamba'"
    assert "1b-mamba-mla" in err.value.fix


def test_unknown_name_without_close_match_points_to_the_list():
    with pytest.raises(ZebraError) as err:
        find_recipe("qqqqqqqq")
    assert err.value.fix == "see `zebra recipes list`"


def test_missing_file_path():
    with pytest.raises(ZebraError) as err:
        find_recipe("missing/x.yaml")
    assert err.value.message == "missing/x.yaml: recipe file not found"
