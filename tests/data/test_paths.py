"""`TARGET[:WEIGHT]` data paths: parsed once into a `DataPath` that the recipe, the trainer and `resolve_prefixes`
hand on."""

from __future__ import annotations

import pytest

from zebra.core.errors import ZebraError
from zebra.data.paths import parse_data_path, prep_folder
from zebra.data.prefixes import resolve_prefixes
from zebra.data.prep import plan_prep, run_prep
from zebra.data.text_sources import open_source
from zebra.recipes import load_recipe

from .helpers import write_source


@pytest.mark.parametrize(
    ("entry", "target", "weight"),
    [
        ("data/edu", "data/edu", 1.0),
        ("data/edu:0.25", "data/edu", 0.25),
        ("data/edu:3", "data/edu", 3.0),
        ("data/edu:1e-3", "data/edu", 1e-3),
        ("@sample:2", "@sample", 2.0),
        ("/mnt/a:b/x", "/mnt/a:b/x", 1.0),  # the ':' belongs to a folder name
        ("/mnt/a:b/x:0.5", "/mnt/a:b/x", 0.5),
        ("data/v1:2:1.0", "data/v1:2", 1.0),  # a ':' in the last part needs an explicit weight
    ],
)
def test_parse_data_path(entry, target, weight):
    assert parse_data_path(entry) == (target, weight)
    assert str(parse_data_path(entry)) == entry  # written back as given (a recipe shown, a run's config.yaml)
    recipe = load_recipe("tiny", overrides={"data.paths": [entry]})  # a typed override, as --data gives
    assert recipe.data.paths == [(target, weight)]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("a:-1", "'a:-1': weight '-1' is not a positive number"),
        ("a:0", "'a:0': weight '0' is not a positive number"),
        ("a:x", "'a:x': weight 'x' is not a positive number"),
        ("a:nan", "'a:nan': weight 'nan' is not a positive number"),
        ("a:inf", "'a:inf': weight 'inf' is not a positive number"),
        ("a:", "'a:': weight '' is not a positive number"),
        (":2", "':2': empty prefix"),
        ("", "'': empty prefix"),
    ],
)
def test_bad_entries_are_refused_by_every_reader(entry, message):
    with pytest.raises(ZebraError, match=message):
        parse_data_path(entry)
    with pytest.raises(ZebraError, match=message):
        resolve_prefixes(entry)
    if entry:  # `--set data.paths=[]` is an empty list, not an empty entry
        with pytest.raises(ZebraError, match=f"data.paths: {message}"):
            load_recipe("tiny", overrides=[f"data.paths=[{entry}]"])


def test_recipe_accepts_a_colon_inside_a_folder_name():
    recipe = load_recipe("tiny", overrides=["data.paths=[/mnt/a:b/x,/mnt/c:0.5]"])
    assert recipe.data.paths == [("/mnt/a:b/x", 1.0), ("/mnt/c", 0.5)]


def test_prep_folder_and_weighted_entries(texts, tmp_path):
    source = write_source("jsonl", tmp_path / "src", texts)
    out = tmp_path / "a:b" / "out"  # a ':' in a parent folder
    run_prep(plan_prep(open_source(str(source)), out, tokenizer="byte", shards=2, workers=1))
    assert prep_folder(out) == out and prep_folder(out / "manifest.json") == out
    prefix = next(out.glob("*_00000.bin")).with_suffix("")
    assert prep_folder(prefix) is None and prep_folder(tmp_path / "missing") is None
    assert prep_folder(tmp_path / "src") is None  # a folder without manifest.json
    assert sum(w for _, w in resolve_prefixes(str(out))) == pytest.approx(1.0)
    assert sum(w for _, w in resolve_prefixes(f"{out}:0.5")) == pytest.approx(0.5)
    assert resolve_prefixes(f"{prefix}:2") == [(str(prefix), 2.0)]


def test_a_folder_or_prefix_without_documents_is_refused(tmp_path):
    """A prep that skipped every row leaves a complete folder with empty shards: training refuses it by name
    (before any run folder exists), as it refuses an empty PREFIX, instead of starting with no data."""
    source = write_source("jsonl", tmp_path / "src", ["", ""])
    out = tmp_path / "empty"
    run_prep(plan_prep(open_source(str(source)), out, tokenizer="byte", shards=1, workers=1))
    with pytest.raises(ZebraError, match=r"empty: no document was written \(2 row\(s\) read, all skipped\)"):
        resolve_prefixes(str(out))
    prefix = next(out.glob("*_00000.bin")).with_suffix("")
    with pytest.raises(ZebraError, match=r"holds no tokens"):
        resolve_prefixes(str(prefix))
