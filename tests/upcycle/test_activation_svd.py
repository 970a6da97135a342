"""`zebra upcycle --svd activation`: MLA factors fitted to W x on calibration text instead of to W."""

from __future__ import annotations

import pytest
import torch

from zebra.upcycle import StudentOptions, open_teacher, upcycle
from zebra.upcycle.calibration import Calibration, attention_input_moments
from zebra.upcycle.mla import head_order, truncated_svd, whitening

from .teachers import tiny_llama
from .test_cli import assert_one_line_error, zebra


def anisotropic_inputs(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """[n, d] inputs whose channel scales span three orders of magnitude, as LLM hidden states do."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * torch.logspace(0, -3, d, dtype=torch.float64)


def output_error(w: torch.Tensor, up: torch.Tensor, down: torch.Tensor, x: torch.Tensor) -> float:
    """||(W - up down) x^T||^2 / ||W x^T||^2 over the inputs x [n, d]."""
    w = w.double()
    return float(((w - up.double() @ down.double()) @ x.T).square().sum() / (w @ x.T).square().sum())


def kv_output_error(student: dict, layer: int, kept: torch.Tensor, moment: torch.Tensor) -> float:
    """E||(W - up latent) x||^2 / E||W x||^2 for x with second moment `moment`, W (`kept`) the rows that dense
    layer `layer`'s kv_up rebuilds: each KV head's K rows without RoPE (32), then its V rows (64)."""
    mixer = f"model.layers.{2 * layer}.mixer."
    up = student[mixer + "kv_up_proj.weight"].double()  # [H * 96, r]
    rank = up.shape[1]
    latent = student[mixer + "kv_down_proj.weight"][:rank].double()  # [r, D] (then the RoPE key)
    up = up.view(9, 32 + 64, rank)[0::3]  # one query head per KV group: [Hkv, 96, r]
    diff = kept - torch.cat([up[:, :32].reshape(96, rank), up[:, 32:].reshape(192, rank)]) @ latent
    return float(((diff @ moment) * diff).sum() / ((kept @ moment) * kept).sum())


def test_the_activation_svd_keeps_more_of_w_x_and_reports_that_share():
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(48, 32, generator=g), anisotropic_inputs(4096, 32)
    moment = x.T @ x / len(x)  # [d, d]
    for rank in (4, 8, 16):
        plain = truncated_svd(w, rank)
        activation = truncated_svd(w, rank, whitening(moment))
        assert output_error(w, *activation[:2], x) < 0.5 * output_error(w, *plain[:2], x)
        assert activation[2] == pytest.approx(1 - output_error(w, *activation[:2], x), abs=1e-3)
    up, down, energy = truncated_svd(w, 32, whitening(moment))  # full rank: W itself
    torch.testing.assert_close(up @ down, w, rtol=1e-5, atol=1e-5)
    assert energy == pytest.approx(1.0)


def test_the_moments_are_those_of_each_layers_attention_input(
    tmp_path, smollm2_4layer_dir, python_docs_tokens
):
    """The hooked second moments equal x^T x / N of the inputs HF's own attention receives."""
    from zebra.upcycle.calibration import calibration_tokens
    from zebra.upcycle.teachers.causal_lm import build_teacher_model

    teacher = open_teacher(smollm2_4layer_dir)
    calibration = Calibration(str(python_docs_tokens), samples=2, seq_len=32, device="cpu")
    moments, tokens = attention_input_moments(teacher, calibration, [1, 2])
    ids = calibration_tokens(str(python_docs_tokens), teacher.tokenizer, teacher.shape.vocab_size, 2, 32)
    model = build_teacher_model(teacher, torch.float32).eval()
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states  # [L + 1] x [2, 32, D]
    teacher.tensors.close()
    assert tokens == 64 and sorted(moments) == [1, 2]
    for layer in (1, 2):
        x = model.model.layers[layer].input_layernorm(hidden[layer]).flatten(0, 1).double()  # [64, D]
        torch.testing.assert_close(moments[layer], x.T @ x / 64, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # the 30-layer teacher upcycled twice after a calibration pass: ~60 s on the loaded 2 cores
def test_the_real_teacher_upcycles_with_a_smaller_kv_error_on_its_own_inputs(
    tmp_path, smollm2_4layer_dir, python_docs_tokens
):
    """SmolLM2 (4 layers) at the default ranks: on the calibration text, every MLA layer's [W_k; W_v] x is
    reproduced more closely by the activation-aware factors than by the plain ones; the report says how."""
    from safetensors.torch import load_file

    calibration = Calibration(str(python_docs_tokens), samples=8, seq_len=64, device="cpu")
    options = StudentOptions(mla_layers="all")
    plain = upcycle(smollm2_4layer_dir, tmp_path / "plain", options)
    activation = upcycle(smollm2_4layer_dir, tmp_path / "activation", options, calibration=calibration)
    teacher = open_teacher(smollm2_4layer_dir)
    moments, _ = attention_input_moments(teacher, calibration, range(4))
    weights = {name: load_file(tmp_path / name / "model.safetensors") for name in ("plain", "activation")}
    order = head_order(64, 32)
    for layer in range(4):
        t = f"model.layers.{layer}.self_attn."
        k = teacher.tensors.get(t + "k_proj.weight").double().view(3, 64, 576)[:, order]  # [Hkv, Dh, D]
        v = teacher.tensors.get(t + "v_proj.weight").double()  # [Hkv*Dh, D]
        # what kv_up rebuilds: each KV head's K rows without RoPE, then V
        kept = torch.cat([k[:, :32].reshape(96, 576), v])  # [288, D]
        errors = {name: kv_output_error(w, layer, kept, moments[layer]) for name, w in weights.items()}
        assert errors["activation"] < 0.8 * errors["plain"], (layer, errors)
    teacher.tensors.close()
    assert plain.svd == {"method": "plain"}
    assert activation.svd == {"method": "activation", "calibration": str(python_docs_tokens), "tokens": 512}
    assert any(n.startswith("activation-aware SVD") for n in activation.notes)
    assert any("--svd activation --calibration DATA keeps more" in n for n in plain.notes)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["TEACHER", "--svd", "activation"], ["--svd activation needs --calibration DATA"]),
        (
            ["TEACHER", "--calibration", "@sample"],
            ["--calibration without --compose is for --svd activation"],
        ),
        (["TEACHER", "--svd", "exact"], ["--svd exact: unknown", "plain, activation"]),
        (
            ["TEACHER", "--svd", "activation", "--calibration", "SMOL_TEXT"],
            ["tokenized with another tokenizer"],
        ),
        (["--compose", "a", "b", "--svd", "activation"], ["--svd applies to a TEACHER's upcycle"]),
    ],
)
def test_bad_activation_svd_options_get_one_line_errors(
    tmp_path, smollm2_4layer_dir, python_docs_tokens, args, needles
):
    """TEACHER is a tiny byte-tokenizer Llama; SMOL_TEXT is text in SmolLM2's tokenizer."""
    teacher = tiny_llama(tmp_path / "teacher")
    args = [{"TEACHER": teacher, "SMOL_TEXT": python_docs_tokens}.get(a, a) for a in args]
    result = zebra("upcycle", *args, "--mla", "1", "-o", tmp_path / "x")
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "x").exists()
