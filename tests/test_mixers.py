"""The mixer registry (`zebra.mixers`): a mixer declared in this file only, by one `register_mixer`, builds,
trains, decodes with the cache and shows in `zebra recipes list`; the built-in entries agree with the schema."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from zebra.mixers import MIXERS, MixerSpec, mixer_spec, register_mixer
from zebra.recipes.schema import ModelSpec
from zebra.spec import arch

TOY = "T"  # a pattern character no built-in mixer uses


class ToyDecay(nn.Module):
    """A per-channel leaky average: `s_t = a * s_{t-1} + (1 - a) * in_proj(x_t)`, `y_t = out_proj(s_t)` with
    `a = sigmoid(decay)` `[W]`; its cache slot holds `s` `[B, W]` (no convolution)."""

    def __init__(self, hidden_size: int, width: int, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.in_proj = nn.Linear(hidden_size, width, bias=False)
        self.decay = nn.Parameter(torch.empty(width))
        self.out_proj = nn.Linear(width, hidden_size, bias=False)
        self.reset_parameters()

    @classmethod
    def from_config(cls, config, layer_idx: int) -> ToyDecay:
        return cls(config.hidden_size, config.toy_width, layer_idx)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.decay.uniform_(1.0, 3.0)

    def forward(
        self, hidden_states, *, attention_mask=None, position_ids=None, cache=None, cu_seqlens=None, **unused
    ):  # docs/models.md's contract: keywords a mixer does not use (the model's `memo`) land in **unused
        x = self.in_proj(hidden_states)  # [B, T, W]
        a = torch.sigmoid(self.decay)  # [W]
        state = cache.recurrent_state(self.layer_idx)[0] if cache is not None else None
        s = x.new_zeros(x.shape[0], x.shape[2]) if state is None else state.to(x.dtype)  # [B, W]
        outputs = []
        for t in range(x.shape[1]):
            s = a * s + (1 - a) * x[:, t]
            outputs.append(s)
        if cache is not None:
            cache.update_recurrent(self.layer_idx, s, None)
        return self.out_proj(torch.stack(outputs, dim=1))  # [B, T, D]


TOY_SPEC = MixerSpec(
    char=TOY,
    name="toy",
    label="Toy",
    title="Toy decay",
    layer=f"{__name__}.ToyDecay",
    params=lambda c: 2 * c.hidden_size * c.toy_width + c.toy_width,
    state="recurrent",
    state_shapes=lambda c, batch_size, max_length: {"recurrent": (batch_size, c.toy_width)},
    config_prefix="toy",
    config_defaults={"width": 12},
    summary=lambda c: f"width {c.toy_width}",
)


@pytest.fixture
def toy():
    """The toy mixer registered for one test."""
    register_mixer(TOY_SPEC)
    yield TOY_SPEC
    del MIXERS[TOY]


def toy_config(pattern: str = "T-*-T-"):
    from tests.models.tiny import tiny_config

    return tiny_config("tiny", layer_pattern=pattern, num_hidden_layers=len(pattern), initializer_range=0.1)


def toy_model(pattern: str = "T-*-T-"):
    from zebra.models import ZebraForCausalLM

    torch.manual_seed(0)
    return ZebraForCausalLM(toy_config(pattern)).double()


def test_toy_mixer_builds_with_its_registered_sizes(toy):
    model = toy_model()
    mixers = [layer.mixer for layer in model.model.layers]
    assert [type(m).__name__ for m in mixers[::2]] == ["ToyDecay", "MultiLatentAttention", "ToyDecay"]
    assert model.config.toy_width == 12 and mixers[0].in_proj.weight.shape == (12, 64)
    assert model.num_parameters() == arch.param_count(model.config).total
    assert arch.param_count(model.config).by_kind["toy"] == 2 * (2 * 64 * 12 + 12 + 64)
    decay = mixers[0].decay
    assert bool(decay.ge(1.0).all()) and bool(decay.le(3.0).all())  # its own reset_parameters


def test_toy_mixer_trains_one_step(toy):
    model = toy_model().train()
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    loss = model(ids, labels=ids).loss
    assert torch.isfinite(loss)
    loss.backward()
    toy_layer = model.model.layers[0].mixer
    before = {n: p.detach().clone() for n, p in toy_layer.named_parameters()}
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in toy_layer.parameters())
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(not torch.equal(p, before[n]) for n, p in toy_layer.named_parameters())


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_toy_mixer_decodes_with_the_cache(toy, static):
    from zebra.models import ZebraCache

    model = toy_model().eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    with torch.no_grad():
        full = model(ids).logits  # [B, T, V]
        if static:
            cache = ZebraCache(model.config, batch_size=2, max_length=8, dtype=torch.float64)
            assert cache.layers[0].recurrent.shape == (2, 12) and cache.layers[0].conv is None
        else:
            cache = ZebraCache(model.config)
        steps = [model(ids[:, :5], cache=cache).logits]
        steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-9, atol=1e-9)
    assert arch.decode_cache(model.config, 8).fixed_per_sequence == 2 * 12 * 4  # two toy slots, float32
    generated = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert generated.shape == (2, 11)


RECIPE = """\
description: {description}, byte tokenizer
model:
  vocab_size: 272
  hidden_size: 64
  intermediate_size: 128
  num_layers: {num_layers}
  pattern: "{pattern}"
  mla: {{num_heads: 4, q_lora_rank: 0, kv_lora_rank: 32, qk_nope_head_dim: 16, qk_rope_head_dim: 16,
        v_head_dim: 16}}
data: {{tokenizer: byte}}
"""


def test_toy_mixer_shows_in_recipes_list(toy, tmp_path, monkeypatch):
    from zebra.cli.main import app
    from zebra.recipes import loader

    for name, pattern in (("toy-hybrid", "T-*-T-"), ("toy-pure", "T-T-")):
        text = RECIPE.format(description=name, num_layers=len(pattern), pattern=pattern)
        (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(text))
    monkeypatch.setattr(loader, "builtin_dir", lambda: tmp_path)  # the recipes `list` shows: these two
    result = CliRunner().invoke(app, ["recipes", "list", "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["toy-hybrid"]["mixer"] == "1 MLA+2 Toy"
    assert rows["toy-pure"]["mixer"] == "Toy"
    table = CliRunner().invoke(app, ["recipes", "list"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "1 MLA+2 Toy" in table.stdout


def test_toy_mixer_is_in_the_model_card(toy):
    from zebra.convert.model_card import model_card

    card = model_card(toy_config())
    assert "| sublayers | 6 (1 MLA, 3 SwiGLU MLP, 2 Toy decay) |" in card
    assert "| Toy decay | width 12 |" in card


def test_an_unregistered_character_is_refused_everywhere():
    from zebra.models import ZebraConfig

    with pytest.raises(ValueError, match=r"unknown characters \['T'\] \(allowed: M G K L \* -\)"):
        arch.validate_pattern("T-*-")
    with pytest.raises(ValueError, match="ZebraConfig: layer pattern 'T-'"):
        ZebraConfig(layer_pattern="T-", num_hidden_layers=2)
    with pytest.raises(ValueError, match="unknown sublayer character 'T'"):
        mixer_spec(TOY)


def test_register_refuses_a_taken_character_or_name(toy):
    with pytest.raises(ValueError, match="'T' is taken by 'toy'"):
        register_mixer(dataclasses.replace(TOY_SPEC, name="other"))
    with pytest.raises(ValueError, match="'gdn' is already registered"):
        register_mixer(dataclasses.replace(TOY_SPEC, char="U", name="gdn"))
    with pytest.raises(ValueError, match="not one visible character"):
        register_mixer(dataclasses.replace(TOY_SPEC, char="UV", name="other"))
    with pytest.raises(ValueError, match="state 'kv'"):
        register_mixer(dataclasses.replace(TOY_SPEC, char="U", name="other", state="kv"))
    assert set(MIXERS) == {"M", "G", "K", "L", "*", "-", TOY}


def test_a_registered_recurrent_mixer_can_be_placed_by_the_ratio(toy):
    from zebra.models import ZebraConfig

    config = ZebraConfig(num_hidden_layers=8, recurrent_type="toy", hybrid_attention_ratio=0.25)
    assert config.layer_pattern == "*-T-T-T-"


@pytest.mark.parametrize("spec", [s for s in MIXERS.values() if s.config_defaults], ids=lambda s: s.char)
def test_each_recipe_section_has_the_fields_and_defaults_of_its_mixer(spec):
    """`ModelSpec.flat()` maps `model.<section>.<field>` to `<prefix>_<field>`: the names and defaults must agree
    with the registry's, which is where `ZebraConfig` takes its defaults from."""
    section = {f.name: f.default for f in dataclasses.fields(getattr(ModelSpec(), spec.section))}
    assert section == spec.config_defaults
