"""The upcycle itself: every teacher source into every mixer, what is copied, factorised, repeated and kept."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from zebra.core.errors import ZebraError
from zebra.upcycle import StudentOptions, upcycle, upcycle_teacher
from zebra.upcycle.mla import head_order
from zebra.upcycle.report import ASSEMBLED, COPIED, INITIALISED, REPEATED, SVD

from .megatron_dense import write_torch, write_torch_dist
from .teachers import tiny_llama

MIXERS = ["mamba", "gdn", "kda"]


def tensors(folder) -> dict[str, torch.Tensor]:
    """The weights of an export or an HF teacher folder (one safetensors file)."""
    return load_file(folder / "model.safetensors")


def repeat_heads(w: torch.Tensor, kv_heads: int, heads: int) -> torch.Tensor:
    """[Hkv * Dh, D] -> [H * Dh, D], each KV head once per query head of its group."""
    return w.view(kv_heads, 1, -1, w.shape[-1]).expand(-1, heads // kv_heads, -1, -1).reshape(-1, w.shape[-1])


@pytest.mark.parametrize("mixer", MIXERS)
def test_the_real_teacher_upcycles_with_copies_bit_equal(tmp_path, smollm2_4layer_dir, mixer):
    from zebra.models import ZebraForCausalLM

    report = upcycle(smollm2_4layer_dir, tmp_path / "student", StudentOptions(mixer=mixer, mla_layers=(0, 2)))

    student, teacher = tensors(tmp_path / "student"), tensors(smollm2_4layer_dir)
    assert report.pattern == {"mamba": "*-M-*-M-", "gdn": "*-G-*-G-", "kda": "*-K-*-K-"}[mixer]
    copies = {
        "model.embeddings.weight": "model.embed_tokens.weight",
        "model.norm.weight": "model.norm.weight",
    }
    for i in range(4):
        t, mixer_prefix = f"model.layers.{i}.", f"model.layers.{2 * i}.mixer."
        copies[f"model.layers.{2 * i}.norm.weight"] = t + "input_layernorm.weight"
        copies[f"model.layers.{2 * i + 1}.norm.weight"] = t + "post_attention_layernorm.weight"
        for p in ("gate_proj", "up_proj", "down_proj"):
            copies[f"model.layers.{2 * i + 1}.mixer.{p}.weight"] = t + f"mlp.{p}.weight"
        out_proj = "out_proj" if mixer == "mamba" and i % 2 else "o_proj"
        copies[mixer_prefix + f"{out_proj}.weight"] = t + "self_attn.o_proj.weight"
    for ours, theirs in copies.items():
        assert torch.equal(student[ours], teacher[theirs]), ours
    listed = {t.name: t for t in report.tensors}
    assert listed.keys() == student.keys()  # every tensor of the export, once
    assert all(listed[name].how == COPIED and listed[name].source == src for name, src in copies.items())
    assert json.loads((tmp_path / "student" / "upcycle.json").read_text()) == report.to_dict()
    model = ZebraForCausalLM.from_pretrained(tmp_path / "student", kernel_backend="torch")
    assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 49152)


@pytest.mark.parametrize("mixer", MIXERS)
def test_recurrent_mixers_take_q_k_v_from_attention_with_kv_heads_repeated(tmp_path, mixer):
    folder = tiny_llama(tmp_path / "hf")  # 4 query heads, 2 KV heads of 16, width 64
    report = upcycle(folder, tmp_path / "student", StudentOptions(mixer=mixer, mla=0))
    student, teacher = tensors(tmp_path / "student"), tensors(folder)
    q, k, v = (teacher[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    m = "model.layers.2.mixer."
    how = {t.name: t.how for t in report.tensors}
    if mixer == "mamba":
        _z, x, b, c, _dt = student[m + "in_proj.weight"].split([64, 64, 64, 64, 4])  # [z | x | B | C | dt]
        assert (
            torch.equal(x, repeat_heads(v, 2, 4))
            and torch.equal(b, repeat_heads(k, 2, 4))
            and torch.equal(c, q)
        )
        assert how[m + "in_proj.weight"] == ASSEMBLED
        kept = ("conv1d.weight", "conv1d.bias", "A_log", "D", "dt_bias", "norm.weight")
    else:
        assert torch.equal(student[m + "q_proj.weight"], q)
        assert torch.equal(student[m + "k_proj.weight"], repeat_heads(k, 2, 4))
        assert torch.equal(student[m + "v_proj.weight"], repeat_heads(v, 2, 4))
        assert how[m + "k_proj.weight"] == how[m + "v_proj.weight"] == REPEATED
        kept = (
            "q_conv1d.weight",
            "k_conv1d.weight",
            "v_conv1d.weight",
            "A_log",
            "dt_bias",
            "o_norm.weight",
            "b_proj.weight",
        )
    assert all(how[m + name] == INITIALISED for name in kept)
    assert any("no published recipe" in n for n in report.notes) == (mixer == "kda")


def test_the_seed_moves_only_what_is_initialised(tmp_path):
    folder = tiny_llama(tmp_path / "hf")
    first = upcycle(folder, tmp_path / "a", StudentOptions(mixer="gdn"), seed=1)
    upcycle(folder, tmp_path / "b", StudentOptions(mixer="gdn"), seed=1)
    upcycle(folder, tmp_path / "c", StudentOptions(mixer="gdn"), seed=2)
    a, b, c = tensors(tmp_path / "a"), tensors(tmp_path / "b"), tensors(tmp_path / "c")
    for t in first.tensors:
        assert torch.equal(a[t.name], b[t.name]), t.name
        differs = not torch.equal(a[t.name], c[t.name])
        assert differs == (t.how == INITIALISED and not t.name.endswith("norm.weight")), t.name


def test_full_rank_mla_factors_reproduce_the_teacher_projections(tmp_path, smollm2_4layer_dir):
    options = StudentOptions(mla=4, q_lora_rank=576, kv_lora_rank=384, qk_rope_head_dim=32)
    report = upcycle(smollm2_4layer_dir, tmp_path / "student", options)
    student, teacher = tensors(tmp_path / "student"), tensors(smollm2_4layer_dir)
    order = head_order(64, 32)

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm())

    for i in range(4):
        m, t = f"model.layers.{2 * i}.mixer.", f"model.layers.{i}.self_attn."
        wq = teacher[t + "q_proj.weight"].view(9, 64, 576)[:, order].reshape(576, 576)
        assert rel(student[m + "q_up_proj.weight"] @ student[m + "q_down_proj.weight"], wq) <= 1e-5
        wk = teacher[t + "k_proj.weight"].view(3, 64, 576)[:, order]  # [Hkv, Dh, D], rows [nope 32 | rope 32]
        wv = teacher[t + "v_proj.weight"].view(3, 64, 576)
        latent, rope_key = student[m + "kv_down_proj.weight"].split([384, 32])
        kv = (student[m + "kv_up_proj.weight"] @ latent).view(9, 32 + 64, 576)[
            0::3
        ]  # one query head per group
        assert rel(kv[:, :32], wk[:, :32]) <= 1e-5 and rel(kv[:, 32:], wv) <= 1e-5
        torch.testing.assert_close(rope_key, wk[:, 32:].mean(dim=0))
    svd = [t for t in report.tensors if t.how == SVD]
    assert svd and all(t.energy == pytest.approx(1.0, abs=1e-6) for t in svd)


def test_mla_equals_multi_query_attention_with_full_ranks_and_rope_on_every_channel(tmp_path):
    """With one KV head (so the shared RoPE key is exact), RoPE on all channels and full ranks, the MLA
    sublayer computes the teacher's attention exactly, once its latent norms are taken out."""
    from transformers import AutoModelForCausalLM

    from zebra.models import ZebraForCausalLM

    folder = tiny_llama(tmp_path / "hf", num_key_value_heads=1)
    options = StudentOptions(mla=2, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16)
    upcycle(folder, tmp_path / "student", options)
    teacher = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    student = ZebraForCausalLM.from_pretrained(
        tmp_path / "student", kernel_backend="torch", dtype=torch.float64
    ).eval()
    mla = student.model.layers[2].mixer
    mla.q_norm.forward = mla.kv_norm.forward = lambda x: (
        x
    )  # the latent norms rescale each token: not attention
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    positions = torch.arange(10).expand(2, 10)
    with torch.no_grad():
        cos_sin = teacher.model.rotary_emb(x, positions)
        expected = teacher.model.layers[1].self_attn(x, position_embeddings=cos_sin, attention_mask=None)[0]
        got = mla(x, position_ids=positions)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)  # the factors are float32 SVDs


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("writer", [write_torch, write_torch_dist], ids=["torch", "torch_dist"])
def test_a_megatron_teacher_upcycles_as_its_hf_twin(tmp_path, writer, mixer):
    folder = tiny_llama(tmp_path / "hf", tie=False)
    root = writer(tmp_path / "megatron", folder, te=writer is write_torch)
    options = StudentOptions(mixer=mixer, mla_layers=(1,))
    from_megatron = upcycle(root, tmp_path / "from-megatron", options)
    upcycle(folder, tmp_path / "from-hf", options)
    assert from_megatron.teacher_format == f"megatron-{writer.__name__.removeprefix('write_')}"
    a, b = tensors(tmp_path / "from-megatron"), tensors(tmp_path / "from-hf")
    assert a.keys() == b.keys() and "lm_head.weight" in a
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mixer", MIXERS)
def test_the_gguf_teacher_upcycles_as_its_hf_folder(tmp_path, smollm2_teacher, smollm2_4layer_dir, mixer):
    """The GGUF reader (dequantised, q/k unpermuted) gives the same student as the HF folder written from it;
    the teacher is cut to its first 4 layers to keep the test small."""
    four_layers = replace(smollm2_teacher, shape=replace(smollm2_teacher.shape, num_layers=4))
    options = StudentOptions(mixer=mixer, mla_layers=(1,))
    report = upcycle_teacher(four_layers, tmp_path / "from-gguf", options, dtype="bf16")
    upcycle(smollm2_4layer_dir, tmp_path / "from-hf", options, dtype="bf16")
    a, b = tensors(tmp_path / "from-gguf"), tensors(tmp_path / "from-hf")
    assert report.teacher_format == "gguf" and report.dtype == "bfloat16"
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "from-gguf" / "tokenizer.json").is_file()


def test_the_teacher_dtype_is_kept_unless_asked(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tiny_llama(tmp_path / "hf")
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    upcycle(tmp_path / "bf16", tmp_path / "auto", StudentOptions())
    upcycle(tmp_path / "bf16", tmp_path / "fp32", StudentOptions(), dtype="fp32")
    auto, fp32, teacher = tensors(tmp_path / "auto"), tensors(tmp_path / "fp32"), tensors(tmp_path / "bf16")
    assert {t.dtype for t in auto.values()} == {torch.bfloat16}
    assert {t.dtype for t in fp32.values()} == {torch.float32}
    assert torch.equal(auto["model.embeddings.weight"], teacher["model.embed_tokens.weight"])
    assert torch.equal(fp32["model.embeddings.weight"], teacher["model.embed_tokens.weight"].float())
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["dtype"] == "bfloat16"


def test_qwen_teachers_upcycle_with_their_differences_reported(tmp_path):
    qwen2 = upcycle(
        tiny_llama(tmp_path / "q2", model_type="qwen2"), tmp_path / "s2", StudentOptions(mixer="gdn")
    )
    assert any("biases are dropped" in n for n in qwen2.notes)
    q3_folder = tiny_llama(tmp_path / "q3", model_type="qwen3")
    qwen3 = upcycle(q3_folder, tmp_path / "s3", StudentOptions(mixer="gdn", mla=0))
    assert any("folded into W_q / W_k" in n for n in qwen3.notes)
    teacher, student = tensors(q3_folder), tensors(tmp_path / "s3")
    norm = teacher["model.layers.0.self_attn.q_norm.weight"]  # [Dh], the same for every head
    folded = (teacher["model.layers.0.self_attn.q_proj.weight"].view(4, 16, 64) * norm[None, :, None]).view(
        64, 64
    )
    torch.testing.assert_close(student["model.layers.0.mixer.q_proj.weight"], folded)


def test_an_existing_output_needs_force(tmp_path):
    folder = tiny_llama(tmp_path / "hf")
    (tmp_path / "out").mkdir()
    with pytest.raises(ZebraError, match=r"--output .*out: already exists"):
        upcycle(folder, tmp_path / "out", StudentOptions())
    report = upcycle(folder, tmp_path / "out", StudentOptions(), force=True)
    assert (tmp_path / "out" / "upcycle.json").is_file() and report.output == str(tmp_path / "out")


def test_the_report_counts_the_kv_cache_and_parameters(tmp_path):
    folder = tiny_llama(tmp_path / "hf")  # 2 layers, 2 KV heads of 16: 64 K/V values per token and layer
    report = upcycle(
        folder, tmp_path / "out", StudentOptions(mixer="gdn", mla=1, kv_lora_rank=16, qk_rope_head_dim=8)
    )
    assert report.kv_cache_fraction == pytest.approx((16 + 8) / (2 * 2 * 2 * 16))
    from zebra.models import ZebraForCausalLM

    model = ZebraForCausalLM.from_pretrained(tmp_path / "out")
    assert report.student_params == sum(p.numel() for p in model.parameters())
    from transformers import AutoModelForCausalLM

    assert report.teacher_params == sum(
        p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters()
    )


def test_the_tokenizer_can_be_replaced_or_left_out(tmp_path):
    folder = tiny_llama(tmp_path / "hf")
    root = write_torch(tmp_path / "megatron", folder, te=True, tokenizer_model=str(tmp_path / "gone"))
    with pytest.raises(ZebraError, match=r"--tokenizer .*gone: "):
        upcycle(root, tmp_path / "a", StudentOptions())
    upcycle(root, tmp_path / "b", StudentOptions(), tokenizer="byte")
    upcycle(folder, tmp_path / "c", StudentOptions(), tokenizer="none")
    assert (tmp_path / "b" / "tokenizer.json").is_file() and not (tmp_path / "c" / "tokenizer.json").exists()


def test_the_report_warns_when_the_kv_latent_keeps_little_of_the_teacher(tmp_path):
    folder = tiny_llama(tmp_path / "hf")  # random weights: the energy spreads over every singular value
    low = upcycle(folder, tmp_path / "low", StudentOptions(mixer="gdn", mla=1, kv_lora_rank=8))
    full = upcycle(folder, tmp_path / "full", StudentOptions(mixer="gdn", mla=1, kv_lora_rank=64))
    assert any(n.startswith("the KV latent (rank 8) keeps") for n in low.notes)
    assert not any("KV latent" in n for n in full.notes)
