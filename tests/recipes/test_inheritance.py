"""`extends:` really inherits: deep merge, lists replace, chains, cycles and missing parents fail loudly."""

from __future__ import annotations

import pytest

from zebra.core.errors import ZebraError
from zebra.recipes import load_recipe


def test_child_overrides_parent_and_keeps_the_rest(write):
    path = write(
        "child.yaml",
        """
        extends: tiny
        train:
          lr: 1.0e-3
        """,
    )
    child, parent = load_recipe(path), load_recipe("tiny")
    assert child.train.lr == 1e-3
    assert child.train.max_steps == parent.train.max_steps
    assert child.model == parent.model


def test_nested_sections_merge_deeply(write):
    path = write("child.yaml", "extends: tiny\nmodel:\n  mla: {num_heads: 2}\n")
    child, parent = load_recipe(path), load_recipe("tiny")
    assert child.model.mla.num_heads == 2
    assert child.model.mla.kv_lora_rank == parent.model.mla.kv_lora_rank
    assert child.model.hidden_size == parent.model.hidden_size


def test_lists_replace(write):
    base = write("base.yaml", "extends: tiny\ndata:\n  paths: [a, b, c]\n")
    child = write("child.yaml", "extends: ./base.yaml\ndata:\n  paths: [z:2]\n")
    assert list(map(str, load_recipe(base).data.paths)) == ["a", "b", "c"]
    assert load_recipe(child).data.paths == [("z", 2.0)]


def test_name_comes_from_the_file_and_description_is_not_inherited(write):
    child = load_recipe(write("my-run.yaml", "extends: 1b-gdn-pure\n"))
    assert child.name == "my-run"
    assert child.description == ""
    named = load_recipe(write("other.yaml", "extends: tiny\nname: custom\ndescription: mine\n"))
    assert (named.name, named.description) == ("custom", "mine")


def test_three_level_chain(write):
    write("a.yaml", "extends: tiny\ntrain: {lr: 1.0e-3, warmup_steps: 5}\n")
    write("b.yaml", "extends: ./a.yaml\ntrain: {warmup_steps: 7}\n")
    c = load_recipe(write("c.yaml", "extends: ./b.yaml\ntrain: {max_steps: 9}\n"))
    assert (c.train.lr, c.train.warmup_steps, c.train.max_steps) == (1e-3, 7, 9)


def test_relative_parent_is_found_beside_the_child_not_the_cwd(write, tmp_path, monkeypatch):
    write("sub/base.yaml", "extends: tiny\ntrain: {seed: 7}\n")
    child = write("sub/child.yaml", "extends: base.yaml\n")
    monkeypatch.chdir(tmp_path)
    assert load_recipe(child).train.seed == 7


def test_builtin_child_inherits_builtin_parent():
    gdn, tiny = load_recipe("tiny-gdn"), load_recipe("tiny")
    assert gdn.model.num_layers == 4 and gdn.model.pattern is None
    assert gdn.model.hidden_size == tiny.model.hidden_size
    assert gdn.train.lr == tiny.train.lr


def test_cycle_is_an_error(write):
    write("a.yaml", "extends: ./b.yaml\n")
    write("b.yaml", "extends: ./a.yaml\n")
    with pytest.raises(ZebraError, match=r"a\.yaml: extends: cycle a\.yaml -> b\.yaml -> a\.yaml$"):
        load_recipe(write("a.yaml", "extends: ./b.yaml\n"))


def test_self_reference_is_a_cycle(write):
    with pytest.raises(ZebraError, match=r"extends: cycle self\.yaml -> self\.yaml"):
        load_recipe(write("self.yaml", "extends: ./self.yaml\n"))


def test_missing_parent_names_the_file_and_suggests(write):
    path = write("child.yaml", "extends: 1b-gdn-pur\n")
    with pytest.raises(ZebraError) as err:
        load_recipe(path)
    assert err.value.message == f"{path}: extends: unknown recipe '1b-gdn-pur'"
    assert "1b-gdn-pure" in err.value.fix


def test_missing_parent_file(write):
    path = write("child.yaml", "extends: ./nowhere.yaml\n")
    with pytest.raises(ZebraError, match=r"child\.yaml: extends: \./nowhere\.yaml: recipe file not found"):
        load_recipe(path)


def test_bare_name_of_a_sibling_file_hints_at_the_path(write):
    write("base.yaml", "extends: tiny\n")
    with pytest.raises(ZebraError) as err:
        load_recipe(write("child.yaml", "extends: base\n"))
    assert "./base.yaml" in err.value.fix


def test_extends_must_be_a_string(write):
    with pytest.raises(ZebraError, match=r"extends: must be a recipe name or path \(expected a string\)"):
        load_recipe(write("child.yaml", "extends: [tiny]\n"))


def test_unknown_key_in_a_child_fails_loudly(write):
    path = write("child.yaml", "extends: tiny\nbases: [x]\n")
    with pytest.raises(ZebraError, match=r"child\.yaml: bases: unknown key"):
        load_recipe(path)
