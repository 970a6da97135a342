"""docs/recipes.md: its field table is the schema's, and it lists every built-in recipe."""

from __future__ import annotations

from pathlib import Path

from zebra.recipes import list_recipes
from zebra.recipes.reference import field_rows, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"


def test_field_table_is_up_to_date():
    text = DOC.read_text()
    assert render(text) == text, (
        "docs/recipes.md is stale: run `python -m zebra.recipes.reference docs/recipes.md`"
    )


def test_rows_carry_type_default_and_range_from_the_metadata():
    rows = {row[0]: row[1:] for row in field_rows()}
    assert rows["train.lr"][:3] == ("float", "`0.0002`", "0 to 1")
    assert rows["train.lr_decay_style"][2] == "`cosine` / `linear` / `constant`"
    assert rows["model.pattern"][:2] == ("str or null", "`null`")
    assert rows["data.paths"][:2] == ("list of str", "`[]`")
    assert rows["model.mla.kv_lora_rank"][2] == "1 to 65,536"
    assert rows["model.mla.q_lora_rank"][2] == "0 to 65,536"
    assert "source" not in rows  # internal fields are not recipe keys


def test_every_builtin_is_documented():
    text = DOC.read_text()
    for name in list_recipes():
        assert f"`{name}`" in text, f"docs/recipes.md does not mention the built-in recipe {name}"
