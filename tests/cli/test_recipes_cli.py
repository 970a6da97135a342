"""`zebra recipes list/show/cp` over the real loader: output, exit codes, one-line errors."""

from __future__ import annotations

import json

import yaml

from zebra.recipes import builtin_dir, list_recipes, load_recipe


def test_list_table_has_every_builtin(cli):
    result = cli("recipes", "list")
    assert result.exit_code == 0
    for header in ("name", "mixers", "params", "seq len", "tokenizer"):
        assert header in result.stdout
    for name in list_recipes():
        assert f" {name} " in result.stdout


def test_list_json(cli):
    rows = json.loads(cli("recipes", "list", "--json").stdout)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == set(list_recipes())
    assert by_name["tiny"]["tokenizer"] == "byte"
    assert by_name["tiny"]["mixer"] == "1 Mamba2+1 GDN+1 KDA+1 MLA"
    assert by_name["1b-mamba-mla"]["mixer"] == "12 Mamba2+4 MLA"
    assert by_name["1b-gdn-pure"]["mixer"] == "GDN"
    assert by_name["1b-mamba-mla"]["seq_len"] == load_recipe("1b-mamba-mla").data.seq_len


def test_show_prints_the_resolved_yaml(cli):
    result = cli("recipes", "show", "tiny-gdn", "--set", "train.lr=1e-3")
    assert result.exit_code == 0
    data = yaml.safe_load(result.stdout)
    assert data == load_recipe("tiny-gdn", overrides=["train.lr=1e-3"]).to_dict()
    assert data["train"]["lr"] == 1e-3


def test_show_json_and_a_yaml_path(cli, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("extends: tiny\ntrain: {seed: 5}\n")
    data = json.loads(cli("recipes", "show", str(path), "--json").stdout)
    assert data["name"] == "mine" and data["train"]["seed"] == 5


def test_show_params(cli):
    info = json.loads(cli("recipes", "show", "tiny", "--params", "--json", "--seq-len", "512").stdout)
    assert info["pattern"] == "*-M-G-K-"
    assert info["seq_len"] == 512
    assert set(info["params_by_kind"]) == {"mla", "mlp", "mamba2", "gdn", "kda"}
    recipe = load_recipe("tiny")
    assert (
        info["params_total"] - info["params_non_embedding"]
        == recipe.model.vocab_size * recipe.model.hidden_size
    )
    per_seq = info["cache_bytes_per_token"] * 512 + info["cache_state_bytes_per_sequence"]
    assert info["cache_bytes_per_sequence"] == per_seq
    table = cli("recipes", "show", "tiny", "--params")
    assert "layer pattern" in table.stdout and "*-M-G-K-" in table.stdout


def test_show_unknown_recipe_suggests(zebra):
    r = zebra("recipes", "show", "tyni")
    assert r.returncode == 1
    assert r.stderr.splitlines() == ["error: unknown recipe 'tyni'", "hint: did you mean tiny?"]
    assert r.stdout == ""


def test_show_bad_override_is_one_line(zebra):
    r = zebra("recipes", "show", "tiny", "--set", "train.lrr=1")
    assert r.returncode == 1
    assert r.stderr.strip() == "error: --set: train.lrr: unknown key (did you mean 'lr'?)"


def test_missing_recipe_without_a_tty_names_the_argument(zebra):
    r = zebra("recipes", "show")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0] == "error: missing RECIPE"
    assert lines[1].startswith("hint: pass RECIPE (one of: 1b-gdn")
    assert all(name in lines[1] for name in ("tiny", "tiny-gdn", "tiny-kda", "tiny-mamba"))  # every recipe
    assert "Traceback" not in r.stderr


def test_yes_never_prompts(cli):
    result = cli("recipes", "show", "--yes")
    assert result.exit_code == 1 and "missing RECIPE" in result.stderr


def test_cp_to_a_file_and_a_folder(cli, tmp_path):
    target = tmp_path / "my-gdn.yaml"
    result = cli("recipes", "cp", "tiny-gdn", str(target))
    assert result.exit_code == 0 and "copied tiny-gdn.yaml" in result.stdout
    copied = load_recipe(target)
    assert copied.name == "my-gdn"
    assert copied.model == load_recipe("tiny-gdn").model  # keeps `extends: tiny`, so it still resolves
    folder = tmp_path / "recipes"
    assert cli("recipes", "cp", "tiny", f"{folder}/").exit_code == 0
    assert (folder / "tiny.yaml").read_text() == (builtin_dir() / "tiny.yaml").read_text()
    assert not list(tmp_path.rglob("*.tmp"))


def test_cp_refuses_to_overwrite_without_force(cli, tmp_path):
    target = tmp_path / "x.yaml"
    target.write_text("keep me\n")
    result = cli("recipes", "cp", "tiny", str(target))
    assert result.exit_code == 1
    assert f"{target}: already exists" in result.stderr and "--force" in result.stderr
    assert target.read_text() == "keep me\n"
    assert cli("recipes", "cp", "tiny", str(target), "--force").exit_code == 0
    assert load_recipe(target).name == "x"


def test_cp_unknown_recipe(cli, tmp_path):
    result = cli("recipes", "cp", "1b-gdn-pur", str(tmp_path / "x.yaml"))
    assert result.exit_code == 1 and "did you mean 1b-gdn-pure" in result.stderr
    assert not (tmp_path / "x.yaml").exists()
