"""The used-by journey as typed (issue 17): `zebra data prep --sample 10BT`, then `zebra train 1b-gdn-pure` finds
the data without --data; before the prep, train names the exact prep command. The Hub is faked (the tests run
offline): FineWeb-Edu is the bundled corpus, and meta-llama/Llama-3.2-1B a BPE trained here, in the HF cache."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app
from zebra.data.text_sources import prep_command, sample_folder
from zebra.recipes import list_recipes, load_recipe

from .helpers import read_all


@pytest.fixture
def llama_tokenizer_in_the_hf_cache(tmp_path, monkeypatch, texts):
    """`meta-llama/Llama-3.2-1B` resolves offline to a BPE trained on the test corpus."""
    from huggingface_hub import constants

    from zebra.data.tokenizers import train_bpe

    repo = tmp_path / "hf-cache" / "models--meta-llama--Llama-3.2-1B"
    snapshot = repo / "snapshots" / ("0" * 40)
    train_bpe(texts, 600).save_pretrained(snapshot)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def _run(*args):
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result


def test_prep_the_sample_then_train_without_data(
    fake_hub, llama_tokenizer_in_the_hf_cache, tmp_path, monkeypatch
):
    from zebra.data import text_sources

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(text_sources, "fineweb_sample_tokens", lambda sample: 1e6)  # the stand-in's size

    before = _run("train", "1b-gdn-pure", "--dry-run")
    assert before.exit_code == 1 and "Traceback" not in before.output
    assert "data path data/fineweb-edu-10BT: no data there" in before.stderr
    assert "make it with `zebra data prep --sample 10BT`," in before.stderr  # exactly the command below

    prep = _run("data", "prep", "--sample", "10BT", "--yes")
    assert prep.exit_code == 0, prep.output
    assert len(read_all(tmp_path / "data" / "fineweb-edu-10BT")) == len(fake_hub.rows)

    train = _run("train", "1b-gdn-pure", "--dry-run", "--json")
    assert train.exit_code == 0, train.output
    (shard,) = json.loads(train.stdout)["data"]
    assert shard.startswith(f"{tmp_path / 'data' / 'fineweb-edu-10BT' / 'fineweb-edu-10BT_00000'}:")


@pytest.mark.parametrize(
    "name", [n for n in list_recipes() if list(map(str, load_recipe(n).data.paths)) != ["@sample"]]
)
def test_the_guides_recipes_name_the_folder_prep_writes_with_their_tokenizer(name):
    recipe = load_recipe(name)
    assert list(map(str, recipe.data.paths)) == [str(sample_folder("10BT", recipe.data.tokenizer))]


def test_the_prep_command_for_a_folder():
    assert prep_command("data/fineweb-edu-10BT", "meta-llama/Llama-3.2-1B") == "zebra data prep --sample 10BT"
    assert prep_command("data/fineweb-edu-100BT-gla-1.3B-100B", "fla-hub/gla-1.3B-100B") == (
        "zebra data prep --sample 100BT --tokenizer fla-hub/gla-1.3B-100B"
    )
    assert prep_command("/big/fineweb-edu-10BT", "meta-llama/Llama-3.2-1B") == (
        "zebra data prep --sample 10BT --output /big/fineweb-edu-10BT"
    )
    assert (
        prep_command("my data", "byte")
        == "zebra data prep --source CORPUS --tokenizer byte --output 'my data'"
    )
