"""Parameter counts and checkpoint names: the model matches zebra.spec.arch, FLA's classes and docs/architecture.md."""

from __future__ import annotations

import pytest
import torch
from tests.models.tiny import tiny_config

from zebra.models import ZebraForCausalLM
from zebra.recipes import list_recipes, load_recipe
from zebra.spec.arch import param_count


def meta_model(config) -> ZebraForCausalLM:
    with torch.device("meta"):
        return ZebraForCausalLM(config)


@pytest.mark.parametrize("name", list_recipes())
def test_num_parameters_equals_arch_count(name):
    config = load_recipe(name).model.to_config()
    assert meta_model(config).num_parameters() == param_count(config).total


@pytest.mark.parametrize("latent_norm", [True, False])
def test_mla_latent_norms_are_counted_only_when_the_model_has_them(latent_norm):
    config = load_recipe(
        "tiny", overrides=[f"model.mla.latent_norm={str(latent_norm).lower()}"]
    ).model.to_config()
    model = meta_model(config)
    names = set(model.state_dict())
    assert any(n.endswith("mixer.kv_norm.weight") for n in names) is latent_norm
    assert any(n.endswith("mixer.q_norm.weight") for n in names) is (latent_norm and config.q_lora_rank > 0)
    assert model.num_parameters() == param_count(config).total


def test_1b_gdn_pure_matches_fla_gated_deltanet():
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    ours = meta_model(load_recipe("1b-gdn-pure").model.to_config()).num_parameters()
    fla_config = GatedDeltaNetConfig(
        hidden_size=2048, head_dim=64, num_heads=8, num_v_heads=16, expand_v=1, hidden_ratio=4,
        intermediate_size=8192, num_hidden_layers=16, vocab_size=128256, tie_word_embeddings=True, conv_size=4,
    )  # fmt: skip
    with torch.device("meta"):
        fla = GatedDeltaNetForCausalLM(fla_config).num_parameters()
    assert ours == fla == 1_203_441_152


def test_1b_kda_pure_matches_fla_kda():
    from fla.models import KDAConfig, KDAForCausalLM

    ours = meta_model(load_recipe("1b-kda-pure").model.to_config()).num_parameters()
    fla_config = KDAConfig(
        hidden_size=2048, head_dim=32, num_heads=16, expand_v=2, intermediate_size=8192, num_hidden_layers=16,
        vocab_size=128256, tie_word_embeddings=True, conv_size=4,
    )  # fmt: skip
    with torch.device("meta"):
        fla = KDAForCausalLM(fla_config).num_parameters()
    assert ours == fla


D, F, V = 64, 192, 272  # tiny: hidden, ffn, vocab


def test_checkpoint_names_and_shapes_follow_docs_architecture():
    """docs/architecture.md 'Checkpoint names' for the tiny hybrid `*-M-G-K-`."""
    config = tiny_config("tiny")
    shapes = {k: tuple(v.shape) for k, v in ZebraForCausalLM(config).state_dict().items()}
    H, dn, dr, dv, Rq, Rkv = 4, 16, 16, 16, 48, 32
    Di, G, N, Hm = 64, 2, 16, 4  # mamba: inner, groups, state, heads
    gH, gK, gHV, gV = 2, 16, 4, 16
    kH, kK, kV = 4, 16, 16
    expected = {
        "model.embeddings.weight": (V, D),
        "model.norm.weight": (D,),
        "lm_head.weight": (V, D),
        "model.layers.0.mixer.q_down_proj.weight": (Rq, D),
        "model.layers.0.mixer.q_norm.weight": (Rq,),
        "model.layers.0.mixer.q_up_proj.weight": (H * (dn + dr), Rq),
        "model.layers.0.mixer.kv_down_proj.weight": (Rkv + dr, D),
        "model.layers.0.mixer.kv_norm.weight": (Rkv,),
        "model.layers.0.mixer.kv_up_proj.weight": (H * (dn + dv), Rkv),
        "model.layers.0.mixer.o_proj.weight": (D, H * dv),
        "model.layers.2.mixer.in_proj.weight": (2 * Di + 2 * G * N + Hm, D),
        "model.layers.2.mixer.conv1d.weight": (Di + 2 * G * N, 1, 4),
        "model.layers.2.mixer.conv1d.bias": (Di + 2 * G * N,),
        "model.layers.2.mixer.A_log": (Hm,),
        "model.layers.2.mixer.D": (Hm,),
        "model.layers.2.mixer.dt_bias": (Hm,),
        "model.layers.2.mixer.norm.weight": (Di,),
        "model.layers.2.mixer.out_proj.weight": (D, Di),
        "model.layers.4.mixer.q_proj.weight": (gH * gK, D),
        "model.layers.4.mixer.k_proj.weight": (gH * gK, D),
        "model.layers.4.mixer.v_proj.weight": (gHV * gV, D),
        "model.layers.4.mixer.a_proj.weight": (gHV, D),
        "model.layers.4.mixer.b_proj.weight": (gHV, D),
        "model.layers.4.mixer.g_proj.weight": (gHV * gV, D),
        "model.layers.4.mixer.q_conv1d.weight": (gH * gK, 1, 4),
        "model.layers.4.mixer.k_conv1d.weight": (gH * gK, 1, 4),
        "model.layers.4.mixer.v_conv1d.weight": (gHV * gV, 1, 4),
        "model.layers.4.mixer.A_log": (gHV,),
        "model.layers.4.mixer.dt_bias": (gHV,),
        "model.layers.4.mixer.o_norm.weight": (gV,),
        "model.layers.4.mixer.o_proj.weight": (D, gHV * gV),
        "model.layers.6.mixer.q_proj.weight": (kH * kK, D),
        "model.layers.6.mixer.k_proj.weight": (kH * kK, D),
        "model.layers.6.mixer.v_proj.weight": (kH * kV, D),
        "model.layers.6.mixer.q_conv1d.weight": (kH * kK, 1, 4),
        "model.layers.6.mixer.k_conv1d.weight": (kH * kK, 1, 4),
        "model.layers.6.mixer.v_conv1d.weight": (kH * kV, 1, 4),
        "model.layers.6.mixer.f_proj.0.weight": (kV, D),
        "model.layers.6.mixer.f_proj.1.weight": (kH * kK, kV),
        "model.layers.6.mixer.b_proj.weight": (kH, D),
        "model.layers.6.mixer.g_proj.0.weight": (kV, D),
        "model.layers.6.mixer.g_proj.1.weight": (kH * kV, kV),
        "model.layers.6.mixer.g_proj.1.bias": (kH * kV,),
        "model.layers.6.mixer.A_log": (kH,),
        "model.layers.6.mixer.dt_bias": (kH * kK,),
        "model.layers.6.mixer.o_norm.weight": (kV,),
        "model.layers.6.mixer.o_proj.weight": (D, kH * kV),
    }
    for i in range(8):
        expected[f"model.layers.{i}.norm.weight"] = (D,)
    for i in (1, 3, 5, 7):
        expected[f"model.layers.{i}.mixer.gate_proj.weight"] = (F, D)
        expected[f"model.layers.{i}.mixer.up_proj.weight"] = (F, D)
        expected[f"model.layers.{i}.mixer.down_proj.weight"] = (D, F)
    assert shapes == expected


def test_uncompressed_query_uses_q_proj():
    shapes = {
        k: tuple(v.shape)
        for k, v in ZebraForCausalLM(tiny_config("tiny", q_lora_rank=0)).state_dict().items()
    }
    assert shapes["model.layers.0.mixer.q_proj.weight"] == (4 * 32, D)
    assert not any("q_down_proj" in k or "q_up_proj" in k for k in shapes)


def test_tied_head_shares_the_embedding():
    model = ZebraForCausalLM(tiny_config("tiny"))
    assert model.lm_head.weight.data_ptr() == model.model.embeddings.weight.data_ptr()
    untied = ZebraForCausalLM(tiny_config("tiny", tie_word_embeddings=False))
    assert untied.lm_head.weight.data_ptr() != untied.model.embeddings.weight.data_ptr()
    assert untied.num_parameters() == model.num_parameters() + V * D
