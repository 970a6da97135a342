"""Zebra <-> FLA (GatedDeltaNetForCausalLM, KDAForCausalLM, GLAForCausalLM): real FLA classes, exact round trips."""

from __future__ import annotations

import json

import pytest
import torch
from convert_helpers import build_model, load_zebra, logits, tokens
from safetensors.torch import load_file

from zebra.convert import convert, open_checkpoint
from zebra.convert.fla_format import FLA_TO_ZEBRA, ZEBRA_TO_FLA
from zebra.core.errors import ZebraError


def _export(tmp_path, kind, tie=True):
    recipe, model = build_model(kind, tie=tie)
    from zebra.convert import export_hf

    src = export_hf(model.state_dict(), model.config, tmp_path / "zebra", recipe=recipe, tokenizer="byte")
    return model, src


@pytest.mark.parametrize(
    ("kind", "cls", "tie"),
    [
        ("gdn", "GatedDeltaNetForCausalLM", True),
        ("kda", "KDAForCausalLM", False),
        ("gla", "GLAForCausalLM", True),
    ],
)
def test_fla_export_loads_into_fla_classes_with_no_missing_keys(tmp_path, kind, cls, tie):
    import fla  # noqa: F401  (registers FLA's model types)
    from transformers import AutoModelForCausalLM

    model, src = _export(tmp_path, kind, tie)
    out = convert(src, "fla", tmp_path / "fla").output

    fla_model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(fla_model).__name__ == cls
    assert (
        info["missing_keys"] == set()
        and info["unexpected_keys"] == set()
        and info["mismatched_keys"] == set()
    )
    assert fla_model.config.num_hidden_layers == 2
    ours = model.state_dict()
    for (
        name,
        tensor,
    ) in fla_model.state_dict().items():  # every FLA tensor holds the Zebra weight it maps from
        assert torch.equal(tensor, ours[FLA_TO_ZEBRA.rename(name)]), name
    saved = load_file(out / "model.safetensors")
    assert ("lm_head.weight" in saved) == (not tie)  # a tied head is saved once
    assert (out / "tokenizer.json").is_file()


@pytest.mark.parametrize("kind", ["gdn", "kda", "gla"])
def test_zebra_fla_zebra_round_trip_is_bitwise(tmp_path, kind):
    model, src = _export(tmp_path, kind)
    fla_dir = convert(src, "fla", tmp_path / "fla").output
    back = convert(fla_dir, "hf", tmp_path / "back").output

    a, b = load_file(src / "model.safetensors"), load_file(back / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    ids = tokens()
    torch.testing.assert_close(logits(load_zebra(back), ids), logits(model, ids), rtol=0, atol=0)


def test_fla_config_uses_fla_field_names(tmp_path):
    _, src = _export(tmp_path, "gdn")
    cfg = json.loads((convert(src, "fla", tmp_path / "fla").output / "config.json").read_text())
    assert cfg["model_type"] == "gated_deltanet"
    assert (cfg["num_heads"], cfg["head_dim"], cfg["num_v_heads"], cfg["expand_v"]) == (2, 16, 4, 1.0)
    assert cfg["num_hidden_layers"] == 2 and cfg["intermediate_size"] == 192 and cfg["norm_eps"] == 1e-6


def test_fla_layer_i_is_zebra_sublayers_2i_and_2i_plus_1():
    assert (
        FLA_TO_ZEBRA.rename("model.layers.3.attn.q_conv1d.weight") == "model.layers.6.mixer.q_conv1d.weight"
    )
    assert FLA_TO_ZEBRA.rename("model.layers.3.mlp_norm.weight") == "model.layers.7.norm.weight"
    assert (
        ZEBRA_TO_FLA.rename("model.layers.7.mixer.down_proj.weight") == "model.layers.3.mlp.down_proj.weight"
    )
    assert ZEBRA_TO_FLA.rename("model.layers.6.norm.weight") == "model.layers.3.attn_norm.weight"


def test_hybrid_to_fla_is_refused_before_anything_is_written(tmp_path):
    _recipe, model = build_model("hybrid")
    from zebra.convert import export_hf

    src = export_hf(model.state_dict(), model.config, tmp_path / "zebra", tokenizer="none")
    with pytest.raises(ZebraError, match="hybrid; FLA has classes for pure GDN"):
        convert(src, "fla", tmp_path / "fla")
    assert not (tmp_path / "fla").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["zebra"]


def test_fla_settings_without_a_zebra_equivalent_are_refused(tmp_path):
    _, src = _export(tmp_path, "gdn")
    fla_dir = convert(src, "fla", tmp_path / "fla").output
    cfg = json.loads((fla_dir / "config.json").read_text())
    (fla_dir / "config.json").write_text(json.dumps({**cfg, "use_gate": False}))
    with pytest.raises(ZebraError, match="use_gate=false") as caught:
        open_checkpoint(fla_dir)
    assert caught.value.fix == "Zebra's GDN always gates its output: keep using this model with FLA itself"


@pytest.mark.parametrize("flag", ["allow_neg_eigval", "safe_gate"])
def test_kda_settings_without_a_zebra_equivalent_say_what_to_do(tmp_path, flag):
    """The fix used to read `hint: -`."""
    _, src = _export(tmp_path, "kda")
    fla_dir = convert(src, "fla", tmp_path / "fla").output
    cfg = json.loads((fla_dir / "config.json").read_text())
    (fla_dir / "config.json").write_text(json.dumps({**cfg, flag: True}))
    with pytest.raises(ZebraError, match=f"{flag}=true has no Zebra equivalent") as caught:
        open_checkpoint(fla_dir)
    assert caught.value.fix == f"Zebra's KDA has no {flag}: keep using this model with FLA itself"
