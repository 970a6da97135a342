"""Typed overrides: `{dotted key: Python value}` from flags and `--init`, checked by the same schema as `--set`
text, which is read once (`parse_assignments`) into the same form."""

from __future__ import annotations

import pytest

from zebra.core.errors import ZebraError
from zebra.data.paths import DataPath
from zebra.recipes import load_recipe
from zebra.recipes.loader import CliText, combine, parse_assignments


def _error(overrides) -> ZebraError:
    with pytest.raises(ZebraError) as err:
        load_recipe("tiny", overrides=overrides)
    return err.value


@pytest.mark.parametrize(
    ("typed", "assignment"),
    [
        ({"train.lr": "fast"}, "train.lr=fast"),  # a wrong type
        ({"train.max_steps": "many"}, "train.max_steps=many"),
        ({"data.mock": "maybe"}, "data.mock=maybe"),
        ({"train.max_steps": 0}, "train.max_steps=0"),  # out of range
        ({"launch.launcher": "slurmm"}, "launch.launcher=slurmm"),  # not a choice (with the suggestion)
        ({"train.lrr": 1e-3}, "train.lrr=1e-3"),  # an unknown key
        ({"model.gdn.num_v_heads": 3}, "model.gdn.num_v_heads=3"),  # a cross-field rule
        ({"train.min_lr": 0.5}, "train.min_lr=0.5"),
        ({"data.paths": ["a:-1"]}, "data.paths=a:-1"),  # a data path's weight
        ({"train.lr.x": 1}, "train.lr.x=1"),  # a value used as a section
    ],
)
def test_a_typed_override_is_refused_in_the_same_line_as_the_set_text(typed, assignment):
    typed_error, text_error = _error(typed), _error([assignment])
    assert (typed_error.message, typed_error.fix) == (text_error.message, text_error.fix)
    assert typed_error.message.startswith("--set"), typed_error.message


def test_typed_values_are_values_and_set_text_is_text():
    """`--set` text goes through the command line's spellings (yes, a,b, null); a typed value is taken as it
    is, so a string is never read as a bool or split into a list."""
    assert load_recipe("tiny", overrides=["train.compile=yes"]).train.compile is True
    assert "expected true or false" in _error({"train.compile": "yes"}).message
    assert load_recipe("tiny", overrides={"train.compile": True}).train.compile is True
    assert load_recipe("tiny", overrides={"description": "a,b = c"}).description == "a,b = c"
    assert load_recipe("tiny", overrides={"train.max_steps": 7}).train.max_steps == 7
    lr = load_recipe("tiny", overrides={"train.lr": 1}).train.lr  # an int where a number goes, as in YAML
    assert lr == 1.0 and type(lr) is float


def test_set_strings_are_read_once_into_the_typed_form():
    sets = parse_assignments(["train.lr=3e-4", " data.paths = a:2,b ", "train.lr=1e-3"])
    assert sets == {"data.paths": "a:2,b", "train.lr": "1e-3"}  # a key given again: its last value and place
    assert all(type(value) is CliText for value in sets.values())
    from_text, from_mapping = load_recipe("tiny", overrides=sets), load_recipe("tiny", overrides=sets.copy())
    assert from_text.train.lr == from_mapping.train.lr == 1e-3
    assert from_text.data.paths == [("a", 2.0), ("b", 1.0)]
    with pytest.raises(ZebraError, match=r"--set 'train\.lr': expected KEY=VALUE"):
        parse_assignments(["train.lr"])
    with pytest.raises(ZebraError, match=r"empty part in key 'train\.\.lr'"):
        parse_assignments(["train..lr=1"])


def test_a_later_override_wins_over_an_earlier_source():
    """`zebra train --init DIR --set model.gdn.num_v_heads=4`: the --set after what --init gave."""
    init = {"model.num_layers": 4, "model.gdn.num_v_heads": 2}
    sets = combine(init, parse_assignments(["model.gdn.num_v_heads=4"]), {"train.max_steps": 3})
    assert list(sets) == ["model.num_layers", "model.gdn.num_v_heads", "train.max_steps"]
    recipe = load_recipe("tiny-gdn", overrides=sets)
    assert recipe.model.gdn.num_v_heads == 4 and recipe.train.max_steps == 3
    assert recipe.overridden == list(sets)


def test_data_paths_keep_their_text_and_their_numbers():
    """A `DataPath` given by a flag is kept; text is parsed once; the recipe shows each as it was written."""
    given = DataPath("/mnt/a:b/x", 0.25)
    recipe = load_recipe("tiny", overrides={"data.paths": [given, "@sample", "c:2"]})
    assert recipe.data.paths == [("/mnt/a:b/x", 0.25), ("@sample", 1.0), ("c", 2.0)]
    assert recipe.data.paths[0] is given
    assert recipe.to_dict()["data"]["paths"] == ["/mnt/a:b/x:0.25", "@sample", "c:2"]
    shown = load_recipe("tiny", overrides=["data.paths=[x:2.50, y]"]).to_dict()["data"]["paths"]
    assert shown == ["x:2.50", "y"]
    assert "expected a list of strings" in _error({"data.paths": [1]}).message
