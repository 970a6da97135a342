"""The native exports carry what vLLM's and SGLang's loaders read, as read in their sources (vLLM 0.33.0,
SGLang 0.5.23, the releases on PyPI; neither runs here: no GPU). Each assertion names the engine file whose
check it holds; transformers must still load the same folder (the logits are compared with Zebra's)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from zebra.cli.main import app
from zebra.convert import export_hf


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """`--to` -> (export folder, Zebra model): tiny-gdn, tiny-mamba and tiny-kimi with random weights."""
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    root = tmp_path_factory.mktemp("engines")
    out = {}
    recipes = {
        "tiny-gdn": ("qwen3.5", "qwen3-next"),
        "tiny-mamba": ("granite-hybrid",),
        "tiny-kimi": ("kimi-linear",),
    }
    for recipe, targets in recipes.items():
        torch.manual_seed(0)
        model = ZebraForCausalLM(load_recipe(recipe).model.to_config()).eval()
        source = export_hf(model.state_dict(), model.config, root / recipe, tokenizer="byte")
        for to in targets:
            result = CliRunner().invoke(app, ["convert", str(source), "--to", to, "--output", str(root / to)])
            assert result.exit_code == 0, result.output
            out[to] = (root / to, model)
    return out


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def _shapes(folder):
    with safe_open(folder / "model.safetensors", "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)


@pytest.mark.parametrize("to", ["qwen3.5", "qwen3-next"])
def test_qwen_layer_kinds_are_readable_by_sglang_as_by_transformers(exports, to):
    """SGLang's Qwen3-Next / Qwen3.5 configs (sglang/srt/configs/qwen3_next.py, `layers_block_type`) ignore
    `layer_types`: layer l is full attention where (l + 1) % full_attention_interval == 0. Without the field its
    loader fails; with the wrong value it builds attention layers the checkpoint has no weights for."""
    config = _config(exports[to][0])
    interval = config["full_attention_interval"]
    sglang_kinds = [
        "full_attention" if (layer + 1) % interval == 0 else "linear_attention"
        for layer in range(config["num_hidden_layers"])
    ]
    assert sglang_kinds == config["layer_types"]


def test_qwen3_5_is_the_dense_text_class_with_split_gdn_projections(exports):
    """vLLM's Qwen3_5DecoderLayer (vllm/model_executor/models/qwen3_5.py) builds the dense MLP only for
    model_type qwen3_5_text and raises on any other; its Qwen3_5Model.hf_to_vllm_mapper stacks in_proj_qkv
    (shards q, k, v), in_proj_z, in_proj_b and in_proj_a. SGLang's Qwen3_5ForCausalLM.load_weights
    (sglang/srt/models/qwen3_5.py) maps the same four names."""
    folder, model = exports["qwen3.5"]
    config, shapes = _config(folder), _shapes(folder)
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    c = model.config
    key, value = c.gdn_num_heads * c.gdn_head_dim, config["linear_num_value_heads"] * c.gdn_head_v_dim
    layer = "model.layers.0.linear_attn."
    assert shapes[layer + "in_proj_qkv.weight"] == (2 * key + value, c.hidden_size)
    assert shapes[layer + "in_proj_z.weight"] == (value, c.hidden_size)
    assert shapes[layer + "in_proj_b.weight"] == shapes[layer + "in_proj_a.weight"]
    assert shapes[layer + "conv1d.weight"] == (2 * key + value, 1, config["linear_conv_kernel_dim"])


def test_kimi_linear_is_stored_in_moonshots_names_that_vllm_and_sglang_load(exports):
    """vLLM's KimiLinearModel.load_weights (vllm/models/kimi_k3/nvidia/model.py) and SGLang's
    KimiLinearForCausalLM.load_weights (sglang/srt/models/kimi_linear.py) stack `self_attn.f_a_proj` into a
    fused projection and `q_conv1d` / `k_conv1d` / `v_conv1d` into the fused convolution; transformers' own
    names (`forget_gate.*`, one `conv1d`) raise a KeyError or a missing shard id there. transformers renames
    Moonshot's names on load (conversion_mapping.py, kimi_linear), so the same folder loads exactly there."""
    from transformers import AutoModelForCausalLM

    folder, model = exports["kimi-linear"]
    shapes = _shapes(folder)
    assert not [k for k in shapes if "forget_gate" in k or k.endswith("self_attn.conv1d.weight")]
    c = model.config
    kda = "model.layers.0.self_attn."
    for x in "qkv":
        assert shapes[f"{kda}{x}_conv1d.weight"] == (c.kda_num_heads * c.kda_head_dim, 1, c.kda_conv_size)
    assert shapes[kda + "f_a_proj.weight"] == (c.kda_head_dim, c.hidden_size)
    assert shapes[kda + "dt_bias"] == (c.kda_num_heads * c.kda_head_dim,)
    assert shapes[kda + "A_log"] == (1, 1, c.kda_num_heads, 1)  # vLLM's a_log_weight_loader takes this form
    native = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([list(b"The zebra ")])
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False).logits
        got = native(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)  # a misplaced tensor costs 1e-2 and more


def test_kimi_linear_config_is_the_dense_nope_form_the_engines_build(exports):
    """vLLM's and SGLang's KimiLinearConfig (vllm/transformers_utils/configs/kimi_linear.py,
    sglang/srt/configs/kimi_linear.py) read the layer kinds from `linear_attn_config` (1-indexed), not from
    `layer_types`; a layer is MoE where layer_idx >= first_k_dense_replace; their MLA asserts mla_use_nope
    (vLLM: "NoPE-only") and takes q_proj uncompressed where q_lora_rank is null; their lm_head is never tied."""
    folder, _ = exports["kimi-linear"]
    config, shapes = _config(folder), _shapes(folder)
    n = config["num_hidden_layers"]
    kda = {i - 1 for i in config["linear_attn_config"]["kda_layers"]}
    full = {i - 1 for i in config["linear_attn_config"]["full_attn_layers"]}
    assert [("linear_attention" if i in kda else "full_attention") for i in range(n)] == config["layer_types"]
    assert kda | full == set(range(n)) and not kda & full
    assert config["first_k_dense_replace"] >= n  # every MLP dense: no expert weights are written
    assert config["mla_use_nope"] is True and config["q_lora_rank"] is None
    kda_sizes = config["linear_attn_config"]  # vLLM sizes its KDA and recurrent state from these
    q_rows = shapes["model.layers.0.self_attn.q_proj.weight"][0]
    assert kda_sizes["head_dim"] * kda_sizes["num_heads"] == q_rows
    assert config["tie_word_embeddings"] is False and "lm_head.weight" in shapes


def test_granite_hybrid_is_the_dense_mamba2_form_vllm_and_sglang_build(exports):
    """vLLM 0.33 lists BambaForCausalLM only as supported until 0.23 (vllm/model_executor/models/registry.py) and
    SGLang 0.5.23 has no Bamba: both serve Mamba2 + MLP layers as GraniteMoeHybridForCausalLM
    (vllm/model_executor/models/granitemoehybrid.py, sglang/srt/models/granitemoehybrid.py). Both build a MoE
    only where num_local_experts > 0 and the dense `shared_mlp` (input_linear rows [gate | up]) where
    shared_intermediate_size > 0; both scale by the Granite multipliers; SGLang reads "linear_attention" as a
    Mamba layer and, when the head is tied, has no `lm_head.weight` parameter to load (a KeyError)."""
    from transformers import AutoModelForCausalLM

    folder, model = exports["granite-hybrid"]
    config, shapes = _config(folder), _shapes(folder)
    assert config["model_type"] == "granitemoehybrid" and config["num_local_experts"] == 0
    assert set(config["layer_types"]) <= {"mamba", "linear_attention"}
    assert config["shared_intermediate_size"] == model.config.intermediate_size
    assert [config[k] for k in ("embedding_multiplier", "residual_multiplier", "logits_scaling")] == [1.0] * 3
    hidden, inner = model.config.hidden_size, model.config.intermediate_size
    assert shapes["model.layers.0.shared_mlp.input_linear.weight"] == (2 * inner, hidden)
    assert "model.layers.0.mamba.A_log" in shapes  # both rename A_log to their A on load
    assert config["tie_word_embeddings"] is ("lm_head.weight" not in shapes)
    native = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([list(b"The zebra ")])
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False).logits
        got = native(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)  # a swapped gate / up costs far more
