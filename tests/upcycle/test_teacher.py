"""Teacher readers: the real GGUF teacher, HF folders, dense Megatron checkpoints; and what they refuse."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from zebra.core.errors import ZebraError
from zebra.upcycle import open_teacher

from .megatron_dense import write_torch, write_torch_dist
from .teachers import tiny_llama


def test_the_gguf_teacher_is_smollm2_and_knows_the_capital_of_france(smollm2_teacher, smollm2_dir):
    from transformers import AutoModelForCausalLM

    s = smollm2_teacher.shape
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.vocab_size) == (30, 576, 9, 3, 49152)
    assert (
        s.tie_word_embeddings and smollm2_teacher.format == "gguf" and smollm2_teacher.dtype == torch.float32
    )
    model = AutoModelForCausalLM.from_pretrained(
        smollm2_dir
    ).eval()  # the dequantised weights, as transformers loads them
    tok = smollm2_teacher.tokenizer
    ids = tok("Paris is the capital of", return_tensors="pt").input_ids
    with torch.no_grad():
        top = model(ids).logits[0, -1].topk(2).indices
    # " France" is among the two likeliest continuations only if llama.cpp's q/k row permutation was undone
    assert " France" in [tok.decode(int(i)) for i in top]


def _same_tensors(a, b) -> None:
    assert a.tensors.shapes().keys() == b.tensors.shapes().keys()
    for name in a.tensors.shapes():
        assert torch.equal(a.tensors.get(name), b.tensors.get(name)), name


@pytest.mark.parametrize(
    ("model_type", "writer", "te", "interleaved", "tie"),
    [
        pytest.param("llama", write_torch, True, False, True, id="llama-torch-te-tied"),
        pytest.param("llama", write_torch, False, True, False, id="llama-torch-local-interleaved-untied"),
        pytest.param("qwen2", write_torch, True, False, True, id="qwen2-torch-te-biases"),
        pytest.param("qwen3", write_torch, False, True, True, id="qwen3-torch-local-interleaved-qk-norm"),
        pytest.param("llama", write_torch_dist, True, False, False, id="llama-torch_dist-te-untied"),
        pytest.param("qwen3", write_torch_dist, False, False, True, id="qwen3-torch_dist-local"),
    ],
)
def test_a_megatron_checkpoint_reads_as_the_hf_model_it_was_made_from(
    tmp_path, model_type, writer, te, interleaved, tie
):
    folder = tiny_llama(tmp_path / "hf", model_type=model_type, tie=tie)
    kwargs = {"interleaved": interleaved} if interleaved else {}
    root = writer(tmp_path / "megatron", folder, te=te, **kwargs)

    megatron, hf = open_teacher(root), open_teacher(folder)

    assert megatron.format == f"megatron-{writer.__name__.removeprefix('write_')}"
    assert megatron.shape == replace(hf.shape, special_ids={})  # Megatron's ids are its tokenizer's
    _same_tensors(megatron, hf)
    assert megatron.tokenizer is not None and megatron.tokenizer.vocab_size == hf.tokenizer.vocab_size


def test_qwen_teachers_carry_their_biases_and_qk_norms(tmp_path):
    qwen2 = open_teacher(tiny_llama(tmp_path / "q2", model_type="qwen2")).shape
    qwen3 = open_teacher(tiny_llama(tmp_path / "q3", model_type="qwen3")).shape
    assert (qwen2.qkv_bias, qwen2.qk_norm) == (True, False)
    assert (qwen3.qkv_bias, qwen3.qk_norm) == (False, True)


def test_a_mixture_of_experts_is_refused(tmp_path):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4)  # fmt: skip
    MixtralForCausalLM(config).save_pretrained(tmp_path / "moe")
    with pytest.raises(
        ZebraError, match="model_type 'mixtral' is a mixture-of-experts model, not a dense GQA"
    ):
        open_teacher(tmp_path / "moe")


def test_a_megatron_mixture_of_experts_is_refused(tmp_path):
    root = write_torch(tmp_path / "megatron", tiny_llama(tmp_path / "hf"), te=True, num_experts=8)
    with pytest.raises(ZebraError, match=r"a mixture-of-experts checkpoint \(num_experts=8\)"):
        open_teacher(root)


def test_a_zebra_export_is_refused(tmp_path):
    from zebra.upcycle import StudentOptions, upcycle

    upcycle(tiny_llama(tmp_path / "hf"), tmp_path / "zebra", StudentOptions(mixer="gdn", mla=1))
    with pytest.raises(ZebraError, match="model_type 'zebra' is a Zebra export"):
        open_teacher(tmp_path / "zebra")


def test_an_fla_model_is_refused(tmp_path):
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    config = GatedDeltaNetConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_heads=2, head_dim=32)
    GatedDeltaNetForCausalLM(config).save_pretrained(tmp_path / "fla")
    with pytest.raises(ZebraError, match="model_type 'gated_deltanet' is an FLA model"):
        open_teacher(tmp_path / "fla")


def test_weights_that_do_not_match_the_config_are_refused(tmp_path):
    import json

    folder = tiny_llama(tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ZebraError, match=r"missing model\.layers\.2\.input_layernorm\.weight"):
        open_teacher(folder)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.gguf", "missing.gguf: no such file"),
        ("./no/such/folder", "no/such/folder: no such file or folder"),
        (
            "nobody-zebra-test/no-such-model",
            "nobody-zebra-test/no-such-model: no such local folder, and the hub id",
        ),
    ],
)
def test_a_missing_file_or_hub_id_is_one_error(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ZebraError, match=message):
        open_teacher(spec)


def test_a_folder_that_is_no_model_is_one_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ZebraError, match=r"neither an HF model folder \(no config\.json\) nor a Megatron checkpoint"
    ):
        open_teacher(tmp_path / "empty")
