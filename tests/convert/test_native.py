"""`zebra convert --to qwen3-next | qwen3.5 | bamba | granite-hybrid | kimi-linear`: a briefly trained tiny model of each exportable
form is exported, reloaded by transformers' own class (no trust_remote_code), checked by `zebra verify` against
the float64 noise floor, and generates Zebra's greedy tokens; what cannot map exactly is refused before any work."""

from __future__ import annotations

import json

import pytest
import torch
from convert_helpers import TRAIN, build_model
from typer.testing import CliRunner

from cli_results import assert_one_line_error
from zebra.cli.main import app
from zebra.convert import export_hf

EXPORTS = [
    ("tiny-gdn", "qwen3-next", "Qwen3NextForCausalLM"),
    ("tiny-gdn", "qwen3.5", "Qwen3_5ForCausalLM"),
    ("tiny-mamba", "bamba", "BambaForCausalLM"),
    ("tiny-mamba", "granite-hybrid", "GraniteMoeHybridForCausalLM"),
    ("tiny-kimi", "kimi-linear", "KimiLinearForCausalLM"),
]


def run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """recipe -> a run folder trained for a few steps (each recipe once per module)."""
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for recipe in dict.fromkeys(r for r, _, _ in EXPORTS):
        result = run("train", recipe, "--output", str(root), *TRAIN)
        assert result.exit_code == 0, result.output
        runs[recipe] = root / recipe
    return runs


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "to", "architecture"), EXPORTS)
def test_trained_tiny_model_exports_exactly_and_generates_zebras_tokens(
    trained, tmp_path, recipe, to, architecture
):
    from transformers import AutoModelForCausalLM

    from zebra.convert.native_verify import cached_greedy, zebra_greedy

    out = tmp_path / to
    result = run("convert", str(trained[recipe]), "--to", to, "--output", str(out))
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [architecture] and "auto_map" not in config
    assert not list(out.glob("*.py"))  # nothing for trust_remote_code to run
    verified = run("verify", str(out), "--against", str(trained[recipe]), "--json")
    report = json.loads(verified.stdout)
    assert verified.exit_code == 0 and report["ok"], verified.output
    (parity,) = report["parity"]
    assert parity["max_abs"] <= 4 * parity["noise_floor"]  # a wrong permutation or norm costs 1e-2 and more
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(model).__name__ == architecture
    source = _zebra_model(trained[recipe])
    ids = torch.tensor([list(b"The zebra ")])
    assert cached_greedy(model.eval(), ids, 12) == zebra_greedy(source, ids, 12)


def _zebra_model(run_dir):
    """The run's latest checkpoint in ZebraForCausalLM (float32, torch kernels)."""
    from zebra.convert.formats import open_checkpoint
    from zebra.convert.verifier import _load

    return _load(open_checkpoint(run_dir), "cpu")


@pytest.mark.parametrize(
    ("recipe", "overrides", "to", "says"),
    [
        ("tiny-kda", {}, "kimi-linear", "model.kda.gate_bias: true"),
        ("tiny-kimi", {"kda_head_v_dim": 32}, "kimi-linear", "model.kda.head_dim: 16"),
        ("tiny-kimi", {"mla_rope": True}, "kimi-linear", "model.mla.rope: true"),
        ("tiny-gdn", {"gdn_allow_neg_eigval": True}, "qwen3-next", "model.gdn.allow_neg_eigval: true"),
        ("tiny-mamba", {"rms_norm_eps": 1e-6}, "bamba", "model.norm_eps: 1e-06"),
        ("tiny-mamba", {"rms_norm_eps": 1e-6}, "granite-hybrid", "model.norm_eps: 1e-06"),
        ("tiny-kda", {}, "granite-hybrid", "use --to kimi-linear"),
        ("tiny-gdn", {}, "bamba", "has GDN sublayers"),
        ("tiny", {}, "kimi-linear", "mixes MLA + Mamba2 + GDN + KDA"),
    ],
)
def test_what_cannot_map_exactly_is_refused_in_one_line_before_any_work(
    tmp_path, recipe, overrides, to, says
):
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    config = load_recipe(recipe).model.to_config(**overrides)
    source = export_hf(ZebraForCausalLM(config).state_dict(), config, tmp_path / "src", tokenizer="byte")
    out = tmp_path / "out"
    result = run("convert", str(source), "--to", to, "--output", str(out))
    assert_one_line_error(result, says)
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["src"]  # not even a temp folder


def test_verify_fails_on_a_wrong_permutation(tmp_path):
    """The parity check can fail: swapping two key heads' rows of Qwen3-Next's interleaved in_proj_qkvz (a
    plausible bug in the permutation) is caught."""
    from safetensors.torch import load_file, save_file

    _, model = build_model("gdn")
    source = export_hf(model.state_dict(), model.config, tmp_path / "src", tokenizer="byte")
    out = tmp_path / "qwen"
    assert run("convert", str(source), "--to", "qwen3-next", "--output", str(out)).exit_code == 0
    weights = load_file(out / "model.safetensors")
    name = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    weights[name] = torch.cat(weights[name].chunk(model.config.gdn_num_heads)[::-1])
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    result = run("verify", str(out), "--against", str(source), "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and not report["parity"][0]["ok"]
    assert report["parity"][0]["max_rel"] > 100 * report["parity"][0]["threshold_rel"]


def test_export_ships_the_tokenizer_with_zebra_chats_plain_conversation_as_its_chat_template(tmp_path):
    from transformers import AutoTokenizer

    from zebra.chat.session import ChatSession, ChatSettings
    from zebra.data.tokenizers import load_tokenizer
    from zebra.generation import Engine

    _, model = build_model("gdn")
    source = export_hf(model.state_dict(), model.config, tmp_path / "src", tokenizer="byte")
    out = tmp_path / "qwen"
    assert run("convert", str(source), "--to", "qwen3.5", "--output", str(out)).exit_code == 0
    shipped = AutoTokenizer.from_pretrained(out)
    session = ChatSession(
        Engine(model.eval()),
        load_tokenizer("byte"),
        ChatSettings(temperature=0.0, max_new_tokens=6, system="Be brief."),
    )
    for text in ("Hi", "And then?"):
        list(session.send(text))
    messages = session.transcript.messages
    rendered = shipped.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    assert session.transcript.text.startswith(rendered) and rendered.endswith("And then?")
    assert shipped("Zebras")["input_ids"] == load_tokenizer("byte")("Zebras")["input_ids"]


@pytest.mark.parametrize(
    ("recipe", "to"),
    [("1b-gdn-pure", "qwen3-next"), ("1b-gdn-pure", "qwen3.5"), ("1b-kda-mla-kimi", "kimi-linear")],
)
def test_1b_recipes_plan_every_tensor_of_the_native_class(recipe, to):
    """At full size, on the meta device (no memory): the planned tensors are exactly the native class's."""
    from transformers import AutoModelForCausalLM

    from zebra.convert.audit import audit, expected_shapes, meta_model
    from zebra.convert.native import native_config, plan, refusal, stored_shapes
    from zebra.convert.native_export import NativeSource
    from zebra.convert.tensor_sources import StateDictSource
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    config = load_recipe(recipe).model.to_config()
    assert refusal(config, to) is None
    zebra = StateDictSource(meta_model(ZebraForCausalLM, config).state_dict())
    source = NativeSource(zebra, plan(config, to, list(zebra.shapes())))
    no_ids = dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"))  # as export_native passes them
    native = meta_model(AutoModelForCausalLM.from_config, native_config(config, to, no_ids))
    expected, tied = expected_shapes(native)
    expected = stored_shapes(to, expected)
    result = audit({k: s for k, (s, _) in source.shapes().items()}, expected, tied=tied, target=to)
    assert result.ok, result.to_dict()
    assert result.checked == len(expected)
