"""Every built-in recipe loads, validates and builds the model configuration it describes."""

from __future__ import annotations

import pytest

from zebra.recipes import builtin_dir, list_recipes, load_recipe
from zebra.spec import arch

GUIDE = ("1b-mamba-mla", "1b-kda-mla", "1b-kda-pure", "1b-gdn", "1b-gdn-pure", "3b-mamba-mla", "8b-mamba-mla")
TINY = ("tiny", "tiny-gdn", "tiny-kda", "tiny-gla", "tiny-mamba", "tiny-kimi")


def test_the_guides_seven_and_the_tiny_recipes_ship():
    assert set(GUIDE + TINY) <= set(list_recipes())
    assert all((builtin_dir() / f"{name}.yaml").is_file() for name in list_recipes())


@pytest.mark.parametrize("name", list_recipes())
def test_builtin_loads_and_names_itself(name):
    recipe = load_recipe(name)
    assert recipe.name == name
    assert recipe.description, "every built-in says what it trains"
    assert recipe.source == str(builtin_dir() / f"{name}.yaml")
    pattern = arch.resolve_pattern(arch.as_config(recipe.model.flat()))
    assert len(pattern) == recipe.model.num_layers


@pytest.mark.parametrize(
    ("name", "mixers"),
    [
        ("tiny", {"*", "M", "G", "K"}),
        ("tiny-gdn", {"G"}),
        ("tiny-kda", {"K"}),
        ("tiny-gla", {"L"}),
        ("tiny-mamba", {"M"}),
        ("1b-gdn-pure", {"G"}),
        ("1b-kda-pure", {"K"}),
        ("1b-gla-pure", {"L"}),
        ("1b-mamba-mla", {"M", "*"}),
        ("1b-kda-mla", {"K", "*"}),
        ("tiny-kimi", {"K", "*"}),
        ("1b-kda-mla-kimi", {"K", "*"}),
    ],
)
def test_mixers_match_the_recipe_name(name, mixers):
    pattern = arch.resolve_pattern(arch.as_config(load_recipe(name).model.flat()))
    assert set(pattern) - {"-"} == mixers


def test_1b_gdn_pure_has_fla_parameter_count():
    # FLA's GatedDeltaNetForCausalLM at the 1b-gdn-pure shapes has 1,203,441,152 parameters (reference.md).
    recipe = load_recipe("1b-gdn-pure")
    assert arch.param_count(arch.as_config(recipe.model.flat())).total == 1_203_441_152


def test_hybrid_attention_ratio_gives_one_mla_per_four_mixers():
    pattern = arch.resolve_pattern(arch.as_config(load_recipe("1b-mamba-mla").model.flat()))
    mixers = pattern.replace("-", "")
    assert mixers.count("*") * 4 == len(mixers)


@pytest.mark.parametrize("name", (*TINY, "1b-gdn-pure", "1b-mamba-mla"))
def test_recipe_builds_a_zebra_config(name):
    pytest.importorskip("transformers")
    recipe = load_recipe(name)
    config = recipe.model.to_config()
    assert config.num_hidden_layers == recipe.model.num_layers
    assert config.layer_pattern == arch.resolve_pattern(arch.as_config(recipe.model.flat()))


@pytest.mark.parametrize("name", ["tiny-kimi", "1b-kda-mla-kimi"])
def test_kimi_form_recipes_have_kimi_linears_shapes(name):
    """3 KDA : 1 MLA, KDA key = value head dim without gate bias, MLA without RoPE and query compression: the
    settings `zebra convert --to kimi-linear` needs (zebra.convert.native)."""
    from zebra.convert.native import refusal

    config = load_recipe(name).model.to_config()
    mixers = config.layer_pattern.replace("-", "")
    assert mixers.count("K") == 3 * mixers.count("*")
    assert config.kda_head_dim == config.kda_head_v_dim and not config.kda_gate_bias
    assert not config.mla_rope and config.q_lora_rank == 0
    assert refusal(config, "kimi-linear") is None
