"""ZebraConfig: recipe kwargs, pattern resolution, validation, save/load, Auto registration."""

from __future__ import annotations

import pytest

from zebra.models import ZebraConfig
from zebra.recipes import list_recipes, load_recipe
from zebra.spec.arch import resolve_pattern


@pytest.mark.parametrize("name", list_recipes())
def test_every_recipe_builds_a_config_with_its_flat_kwargs(name):
    spec = load_recipe(name).model
    config = spec.to_config()
    assert config.model_type == "zebra"
    flat = spec.flat()
    for key, value in flat.items():
        if key == "rope_scaling":
            assert config.rope_parameters["factor"] == value["factor"]
            assert (
                config.rope_parameters["original_max_position_embeddings"]
                == value["original_max_position_embeddings"]
            )
        elif key == "layer_pattern":
            assert config.layer_pattern == (value or resolve_pattern(config))
        else:
            assert getattr(config, key) == value, key
    assert len(config.layer_pattern) == config.num_hidden_layers


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("1b-mamba-mla", "*-M-M-M-" * 4),
        ("3b-mamba-mla", "*-M-M-M-" * 7),
        ("8b-mamba-mla", "*-M-M-M-" * 8),
        ("1b-kda-mla", "*-K-K-K-" * 4),
        ("1b-gdn-pure", "G-" * 16),
        ("tiny", "*-M-G-K-"),
    ],
)
def test_layer_pattern_is_resolved(name, pattern):
    assert load_recipe(name).model.to_config().layer_pattern == pattern


def test_ratio_pattern_and_explicit_pattern():
    assert (
        ZebraConfig(num_hidden_layers=8, recurrent_type="kda", hybrid_attention_ratio=0.5).layer_pattern
        == "*-K-*-K-"
    )
    assert ZebraConfig(num_hidden_layers=4, layer_pattern="M-*-").layer_pattern == "M-*-"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"recurrent_type": "rwkv"}, "recurrent_type='rwkv'"),
        ({"kernel_backend": "cuda"}, "kernel_backend='cuda'"),
        ({"hybrid_attention_ratio": 1.5}, "hybrid_attention_ratio=1.5"),
        ({"gdn_num_heads": 3, "gdn_num_v_heads": 16}, "gdn_num_v_heads=16"),
        ({"layer_pattern": "M-", "num_hidden_layers": 2, "mamba_head_dim": 48}, "mamba_head_dim=48"),
        ({"layer_pattern": "*-M-", "num_hidden_layers": 6}, "has 4 sublayers but num_hidden_layers=6"),
        ({"layer_pattern": "*M--", "num_hidden_layers": 4}, "not followed by an MLP"),
        ({"num_hidden_layers": 7}, "num_hidden_layers=7"),
        ({"hidden_size": 0}, "'hidden_size': 0"),
        ({"layer_pattern": "M-", "num_hidden_layers": 2, "mamba_num_groups": 3}, "mamba_num_groups=3"),
        ({"qk_rope_head_dim": 7}, "qk_rope_head_dim=7"),
        ({"mla_latent_norm": "no"}, "mla_latent_norm='no'"),
        ({"rope_scaling": {"type": "yarn", "factor": 0.5}}, "factor=0.5"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "'linear'"),
        ({"rope_scaling": {"factor": 2.0, "alpha": 1}}, "['alpha']"),
    ],
)
def test_bad_values_raise_with_the_offending_value(overrides, message):
    with pytest.raises(ValueError, match="ZebraConfig") as error:
        ZebraConfig(**overrides)
    assert message in str(error.value)


def test_rope_scaling_becomes_rope_parameters_and_survives_save_load(tmp_path):
    config = ZebraConfig(
        num_hidden_layers=4,
        rope_theta=10000.0,
        rope_scaling={
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
            "mscale_all_dim": 1.0,
        },
    )
    rope = config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0 and rope["rope_theta"] == 10000.0
    assert rope["mscale_all_dim"] == 1.0 and rope["beta_fast"] == 32.0  # Megatron defaults fill the rest
    config.save_pretrained(tmp_path)
    loaded = ZebraConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert loaded.layer_pattern == "G-G-"


def test_mla_latent_norm_survives_save_load_and_maps_back_to_its_recipe_key(tmp_path):
    from zebra.recipes import load_recipe
    from zebra.recipes.schema import ModelSpec

    config = load_recipe("tiny", overrides=["model.mla.latent_norm=false"]).model.to_config()
    assert config.mla_latent_norm is False
    config.save_pretrained(tmp_path)
    loaded = ZebraConfig.from_pretrained(tmp_path)
    assert loaded.mla_latent_norm is False
    overrides = ModelSpec.overrides_from_config(loaded.to_dict())
    assert overrides["model.mla.latent_norm"] is False  # typed, as config.json holds it
    assert load_recipe("tiny", overrides=overrides).model.mla.latent_norm is False
    assert ZebraConfig().mla_latent_norm is True  # recipes trained from scratch keep their norms


def test_an_empty_recipe_model_section_is_the_default_zebra_config():
    """Each default is written once (a mixer's `fields`, MLA's too; `zebra.spec.arch.MODEL_DEFAULTS`): a recipe that
    sets nothing in `model` and `ZebraConfig()` are the same model, YaRN defaults included."""
    from zebra.recipes.schema import ModelSpec

    assert ModelSpec().to_config().to_dict() == ZebraConfig().to_dict()


def test_a_saved_rope_scaling_maps_back_to_the_recipe_yarn_pair():
    """`model.mla.rope_scaling_factor` / `original_max_position_embeddings` are entries of the config's
    `rope_scaling` (their field's declared key): `flat()` writes them there and `overrides_from_config` reads them
    back, through the same map."""
    from zebra.recipes.schema import ModelSpec

    set_yarn = ["model.mla.rope_scaling_factor=4.0", "model.mla.original_max_position_embeddings=512"]
    flat = load_recipe("tiny", overrides=set_yarn).model.flat()
    assert flat["rope_scaling"] == {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    overrides = ModelSpec.overrides_from_config(flat)
    assert overrides["model.mla.rope_scaling_factor"] == 4.0
    assert overrides["model.mla.original_max_position_embeddings"] == 512
    assert load_recipe("tiny", overrides=overrides).model.flat() == flat


def test_auto_classes_know_zebra():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "zebra", num_hidden_layers=4, layer_pattern="*-G-", vocab_size=64, hidden_size=32
    )
    assert isinstance(config, ZebraConfig)
    assert type(AutoModelForCausalLM.from_config(config)).__name__ == "ZebraForCausalLM"
