"""The `{}`-templated key maps: renames, sublayer index arithmetic, inversion, splits and reshapes."""

from __future__ import annotations

import pytest
import torch

from zebra.convert.keymap import KeyMap, Reshape, Split, plan_keys
from zebra.core.errors import ZebraError

FLA_LIKE = KeyMap(
    {
        "model.layers.{i}.attn.{*}": "model.layers.{2i}.mixer.{*}",
        "model.layers.{i}.mlp.{*}": "model.layers.{2i+1}.mixer.{*}",
        "{*}._extra_state": None,
        "lm_head.weight": "lm_head.weight",
    }
)


def test_rename_and_drop():
    assert FLA_LIKE.rename("model.layers.5.attn.g_proj.1.bias") == "model.layers.10.mixer.g_proj.1.bias"
    assert FLA_LIKE.rename("model.layers.5.mlp.up_proj.weight") == "model.layers.11.mixer.up_proj.weight"
    assert FLA_LIKE.rename("decoder.layers.0.mixer.in_proj._extra_state") is None
    with pytest.raises(KeyError):
        FLA_LIKE.rename("model.layers.x.attn.q_proj.weight")


def test_inverse_checks_sublayer_parity():
    inv = FLA_LIKE.inverse()
    assert inv.rename("model.layers.10.mixer.q_proj.weight") == "model.layers.5.attn.q_proj.weight"
    assert inv.rename("model.layers.11.mixer.q_proj.weight") == "model.layers.5.mlp.q_proj.weight"
    assert inv.rename("lm_head.weight") == "lm_head.weight"
    for name in ("model.layers.0.attn.k_proj.weight", "model.layers.7.mlp.down_proj.weight"):
        assert inv.rename(FLA_LIKE.rename(name)) == name


def test_split_and_reshape_plan_without_reading_tensors():
    km = KeyMap(
        {
            "x.{i}.fused": Split(0, ("a.{i}", "n"), ("b.{i}", "m")),
            "x.{i}.alog": Reshape("c.{i}", ("h",)),
        }
    )
    shapes = {"x.3.fused": ((5, 2), torch.float32), "x.3.alog": ((1, 1, 4, 1), torch.float32)}
    pieces = plan_keys(km, shapes, {"n": 2, "m": 3, "h": 4}, origin="ckpt", fix="-")
    assert [(p.name, p.shape) for p in pieces] == [("a.3", (2, 2)), ("b.3", (3, 2)), ("c.3", (4,))]
    fused = torch.arange(10.0).reshape(5, 2)
    assert torch.equal(pieces[1].transform(fused), fused[2:])
    assert pieces[2].transform(torch.arange(4.0).reshape(1, 1, 4, 1)).shape == (4,)


def test_split_size_conflict_is_a_one_line_error():
    km = KeyMap({"w": Split(0, ("a", "n"), ("b", "n"))})
    with pytest.raises(
        ZebraError, match=r"ckpt: w has shape \[5, 2\], but the config splits dim 0 as n=2 \+ n=2"
    ):
        plan_keys(km, {"w": ((5, 2), torch.float32)}, {"n": 2}, origin="ckpt", fix="-")


def test_unmapped_key_names_the_key_and_the_fix():
    with pytest.raises(ZebraError, match=r"ckpt: unexpected tensor mystery\.weight \[3\]") as e:
        plan_keys(FLA_LIKE, {"mystery.weight": ((3,), torch.float32)}, {}, origin="ckpt", fix="see docs")
    assert e.value.fix == "see docs"
