"""`zebra convert --to gguf`: a briefly trained tiny model of each form llama.cpp runs (tiny-gdn -> qwen35,
tiny-mamba -> granitehybrid, tiny-kimi -> kimi-linear) is written as one GGUF file, loaded by llama.cpp through
llama-cpp-python (`optional`: built from source, .ci/run installs it), and its logits and greedy tokens are
compared with Zebra's; what cannot map exactly is refused before any work, and nothing half-written is left."""

from __future__ import annotations

import json
import sys

import pytest
from convert_helpers import TRAIN
from typer.testing import CliRunner

from cli_results import assert_one_line_error
from zebra.cli.main import app
from zebra.convert import export_hf

ARCHS = {"tiny-gdn": "qwen35", "tiny-mamba": "granitehybrid", "tiny-kimi": "kimi-linear"}


def run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """recipe -> a run folder trained for a few steps (each recipe once per module)."""
    root = tmp_path_factory.mktemp("runs")
    for recipe in ARCHS:
        result = run("train", recipe, "--output", str(root), *TRAIN)
        assert result.exit_code == 0, result.output
    return {recipe: root / recipe for recipe in ARCHS}


def _random_export(tmp_path, recipe: str, **overrides):
    import torch

    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    torch.manual_seed(0)
    config = load_recipe(recipe).model.to_config(**overrides)
    return export_hf(ZebraForCausalLM(config).state_dict(), config, tmp_path / "src", tokenizer="byte")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(ARCHS))
def test_trained_tiny_model_runs_in_llama_cpp_with_zebras_logits_and_tokens(
    llama_cpp, trained, tmp_path, recipe
):
    out = tmp_path / f"{recipe}.gguf"
    result = run("convert", str(trained[recipe]), "--to", "gguf", "--output", str(out))
    assert result.exit_code == 0, result.output
    verified = run("verify", str(out), "--against", str(trained[recipe]), "--max-new-tokens", "20", "--json")
    report = json.loads(verified.stdout)
    assert verified.exit_code == 0 and report["ok"], verified.output
    assert ARCHS[recipe] in report["mode"] and not report["problems"]  # llama.cpp tokenised as Zebra does
    (parity,) = report["parity"]
    # measured: every form within 0.4x the floor with llama.cpp's KV cache in float32 (KDA + MLA at 53x with its
    # default float16 cache); a wrong permutation or sign costs 1e-2 and more
    assert parity["max_abs"] <= 10 * parity["noise_floor"]
    assert any("greedy 20 tokens: identical" in note for note in report["notes"])


@pytest.fixture(scope="module")
def quantised_kernels(llama_cpp):
    """A llama-cpp-python built without ggml's AMX code: GCC 12 miscompiles its tile set-up, and such a build
    kills the process on the first batch of a quantised file (.ci/run), which would end the whole test run."""
    import llama_cpp as lib

    if "AMX_INT8 = 1" in lib.llama_print_system_info().decode():
        pytest.fail(
            "llama-cpp-python was built with AMX_INT8: rebuild it with LLAMA_CPP_CMAKE_ARGS of .ci/run"
        )


@pytest.fixture(scope="module")
def float32_gdn(llama_cpp, trained, tmp_path_factory):
    """tiny-gdn's float32 GGUF, its `zebra verify --json` report (the reference the smaller types are held to)."""
    out = tmp_path_factory.mktemp("f32") / "f32.gguf"
    assert run("convert", str(trained["tiny-gdn"]), "--to", "gguf", "-o", str(out)).exit_code == 0
    return out, json.loads(run("verify", str(out), "--against", str(trained["tiny-gdn"]), "--json").stdout)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("gguf_type", "stored", "size"), [("f16", "F16", 0.6), ("q8_0", "Q8_0", 0.4), ("q4_0", "Q4_0", 0.3)]
)
def test_a_smaller_type_runs_in_llama_cpp_at_a_visible_logit_error_within_its_thresholds(
    quantised_kernels, trained, float32_gdn, tmp_path, gguf_type, stored, size
):
    """llama.cpp runs the quantised files through its own CPU kernels (built without AMX-INT8: .ci/run says why)
    and `zebra verify` holds each to QUANT_THRESHOLDS for its type."""
    run_dir, out = trained["tiny-gdn"], tmp_path / f"{gguf_type}.gguf"
    exact, f32 = float32_gdn
    assert (
        run("convert", str(run_dir), "--to", "gguf", "--gguf-type", gguf_type, "-o", str(out)).exit_code == 0
    )
    verified = run("verify", str(out), "--against", str(run_dir), "--json")
    report = json.loads(verified.stdout)
    assert verified.exit_code == 0 and report["ok"], verified.output
    assert any(f"quantised ({stored})" in note for note in report["notes"]), report["notes"]
    # the matrices really are of the smaller type: its error is far above float32's, and the file smaller
    assert report["parity"][0]["max_abs"] > 10 * f32["parity"][0]["max_abs"]
    assert out.stat().st_size < size * exact.stat().st_size


@pytest.mark.slow
def test_a_k_quant_from_llama_cpps_quantizer_runs_within_its_thresholds(quantised_kernels, tmp_path):
    """`--gguf-type q4_k_m`: the float32 file goes through llama.cpp's own quantizer, which stores Q4_K where a
    matrix's rows are multiples of 256 (tiny-gdn widened to 256 for that) and its fallbacks elsewhere; nothing
    but the output is left, and `zebra verify` holds it to the thresholds of every type it holds."""
    run_dir = tmp_path / "runs" / "tiny-gdn"
    wide = ["--set", "model.hidden_size=256", "--set", "model.intermediate_size=768"]
    assert run("train", "tiny-gdn", "--output", str(run_dir.parent), *TRAIN, *wide).exit_code == 0
    reports, sizes = {}, {}
    for gguf_type in ("f32", "q4_k_m"):
        out = tmp_path / "out" / f"{gguf_type}.gguf"
        result = run("convert", str(run_dir), "--to", "gguf", "--gguf-type", gguf_type, "-o", str(out))
        assert result.exit_code == 0, result.output
        verified = run("verify", str(out), "--against", str(run_dir), "--json")
        reports[gguf_type], sizes[gguf_type] = json.loads(verified.stdout), out.stat().st_size
        assert verified.exit_code == 0 and reports[gguf_type]["ok"], verified.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["f32.gguf", "q4_k_m.gguf"]
    (note,) = [n for n in reports["q4_k_m"]["notes"] if n.startswith("quantised (")]
    assert "Q4_K" in note and "Q6_K" in note  # llama.cpp's Q4_K_M keeps some matrices at 6 bits
    assert reports["q4_k_m"]["parity"][0]["max_abs"] > 10 * reports["f32"]["parity"][0]["max_abs"]
    assert sizes["q4_k_m"] < 0.25 * sizes["f32"]


def test_a_quantizer_failure_leaves_neither_file_and_keeps_the_old_one(llama_cpp, tmp_path, monkeypatch):
    """llama.cpp's quantizer refusing (here: a file type it does not know) is one line with its own words; the
    float32 file it was given and its half-written output are both removed."""
    import llama_cpp as lib

    source = _random_export(tmp_path, "tiny-gdn")
    out = tmp_path / "model.gguf"
    assert run("convert", str(source), "--to", "gguf", "-o", str(out)).exit_code == 0
    before = out.read_bytes()
    monkeypatch.setattr(lib, "LLAMA_FTYPE_MOSTLY_Q4_K_M", 999)
    result = run("convert", str(source), "--to", "gguf", "-o", str(out), "--gguf-type", "q4_k_m", "--force")
    assert_one_line_error(result, "llama.cpp's quantizer failed", "invalid output file type 999")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "src"]


@pytest.mark.slow
def test_two_swapped_heads_in_a_q8_0_file_fail_its_thresholds(quantised_kernels, trained, tmp_path):
    """The quantised thresholds are not so loose that a wrong head order passes (measured: two swapped GDN
    output-gate heads cost 0.10 relative and 1 - 2.7e-4 cosine, Q8_0's own error 7.3e-3 at most)."""
    import gguf
    import numpy as np

    run_dir, out = trained["tiny-gdn"], tmp_path / "q8_0.gguf"
    assert run("convert", str(run_dir), "--to", "gguf", "--gguf-type", "q8_0", "-o", str(out)).exit_code == 0
    reader = gguf.GGUFReader(out, "r+")
    (gate,) = [t.data for t in reader.tensors if t.name == "blk.0.attn_gate.weight"]  # [64 rows, 68 bytes]
    # heads 0 and 1 (16 rows each) swapped, whole rows, so every Q8_0 block stays valid
    gate[:32] = np.concatenate([gate[16:32], gate[:16]])
    reader.data.flush()
    del reader, gate
    verified = run("verify", str(out), "--against", str(run_dir), "--json")
    (parity,) = json.loads(verified.stdout)["parity"]
    assert verified.exit_code != 0
    assert parity["max_rel"] > parity["threshold_rel"] and parity["cosine"] < parity["threshold_cosine"]


def test_gguf_holds_the_byte_tokenizer_chat_template_and_llama_cpp_names(tmp_path):
    import gguf

    source = _random_export(tmp_path, "tiny-kimi")
    out = tmp_path / "kimi.gguf"
    assert run("convert", str(source), "--to", "gguf", "--gguf-type", "q8_0", "-o", str(out)).exit_code == 0
    reader = gguf.GGUFReader(out)
    fields = {k: f.contents() for k, f in reader.fields.items()}
    assert fields["general.architecture"] == "kimi-linear"
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.merges"] == []
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == 272 and tokens[ord("a")] == "a" and tokens[256] == "<|endoftext|>"
    assert tokens[ord(" ")] == "Ġ" and tokens[271] == "[PAD271]"  # GPT-2's byte -> character table
    assert fields["tokenizer.ggml.eos_token_id"] == 256 and "tokenizer.chat_template" in fields
    assert fields["kimi-linear.attention.head_count_kv"] == [0, 0, 0, 1]  # 3 KDA, then the MLA
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["blk.0.ssm_conv1d_q.weight"] == "F32"
    assert types["blk.0.ssm_f_b.weight"] == "F32"  # rows of 16 do not fill a 32-wide block
    assert {"blk.3.attn_k_b.weight", "blk.3.attn_v_b.weight", "output.weight"} <= set(types)


@pytest.mark.parametrize(
    ("recipe", "overrides", "says"),
    [
        ("tiny-mamba", {"mamba_expand": 1}, "model.mamba.expand: 1"),
        ("tiny-mamba", {"rms_norm_eps": 1e-6}, "model.norm_eps: 1e-06"),
        ("tiny-gdn", {"gdn_head_v_dim": 32}, "model.gdn.head_v_dim: 32"),
        ("tiny-gdn", {"rms_norm_eps": 1e-5}, "model.norm_eps: 1e-05"),
        ("tiny-kda", {}, "model.kda.gate_bias: true"),
        (
            "tiny-kimi",
            {"kda_num_heads": 2, "kda_head_dim": 32, "kda_head_v_dim": 32},
            "model.kda.num_heads: 2",
        ),
        ("tiny", {}, "mixes MLA + Mamba2 + GDN + KDA"),
    ],
)
def test_what_llama_cpp_cannot_run_exactly_is_refused_in_one_line_before_any_work(
    tmp_path, recipe, overrides, says
):
    source = _random_export(tmp_path, recipe, **overrides)
    out = tmp_path / "out.gguf"
    result = run("convert", str(source), "--to", "gguf", "--output", str(out))
    assert_one_line_error(result, says)
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # not even a temporary file


@pytest.mark.parametrize(("recipe", "says"), [("1b-gdn-pure", None), ("1b-kda-mla-kimi", None),
                                              ("1b-kda-mla", "model.mla.rope: true")])  # fmt: skip
def test_the_1b_recipes_in_a_servable_form_pass_the_gguf_checks_at_full_size(recipe, says):
    """The full-size recipes made to be served (`1b-gdn-pure`, Kimi-Linear's form) meet every llama.cpp
    constraint (one head count for KDA and MLA among them); the RoPE hybrid is refused, naming the field."""
    from zebra.convert.gguf_export import gguf_refusal
    from zebra.recipes import load_recipe

    refusal = gguf_refusal(load_recipe(recipe).model.to_config())
    assert (refusal is None) if says is None else (says in str(refusal))


def test_an_unknown_type_is_refused_in_one_line_naming_the_types(tmp_path):
    source = _random_export(tmp_path, "tiny-gdn")
    result = run(
        "convert", str(source), "--to", "gguf", "--gguf-type", "q3_k", "-o", str(tmp_path / "x.gguf")
    )
    assert_one_line_error(result, "--gguf-type q3_k", "not a type this export writes", "q4_k_m")
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_a_k_quant_without_llama_cpp_python_is_refused_before_any_work(tmp_path, monkeypatch):
    """The k-quants are llama.cpp's quantizer's work: without llama-cpp-python nothing is written."""
    source = _random_export(tmp_path, "tiny-gdn")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    result = run(
        "convert", str(source), "--to", "gguf", "--gguf-type", "q4_k_m", "-o", str(tmp_path / "x.gguf")
    )
    assert_one_line_error(result, "--gguf-type q4_k_m", "llama-cpp-python", "pip install llama-cpp-python")
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_a_failure_while_writing_leaves_no_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    from zebra.convert import gguf_export

    source = _random_export(tmp_path, "tiny-gdn")
    out = tmp_path / "model.gguf"
    assert run("convert", str(source), "--to", "gguf", "-o", str(out)).exit_code == 0
    before = out.read_bytes()
    real, calls = gguf_export._encode, []

    def failing(tensor, qtype):
        calls.append(1)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        return real(tensor, qtype)

    monkeypatch.setattr(gguf_export, "_encode", failing)
    result = run("convert", str(source), "--to", "gguf", "-o", str(out), "--gguf-type", "f16", "--force")
    assert_one_line_error(result, "no space left on device")
    assert out.read_bytes() == before  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "src"]  # no temporary file left


def test_force_never_replaces_a_file_that_is_not_gguf(tmp_path):
    source = _random_export(tmp_path, "tiny-gdn")
    notes = tmp_path / "notes.gguf"
    notes.write_text("my notes")
    result = run("convert", str(source), "--to", "gguf", "-o", str(notes), "--force")
    assert_one_line_error(result, "not a GGUF file")
    assert notes.read_text() == "my notes"


def test_the_mixers_a_llama_cpp_architecture_holds_are_those_that_declare_their_gguf_part():
    """The tensor maps and blockers live in the registry (`MixerSpec.gguf`); an architecture naming a mixer
    without one would fail mid-export instead of being refused."""
    from zebra.convert.gguf_maps import GGUF_ARCHS
    from zebra.mixers import MIXERS, MLP

    held = set().union(*(a.mixers for a in GGUF_ARCHS.values()))
    declared = {s.name for c, s in MIXERS.items() if s.gguf is not None and c != MLP}
    assert held == declared == {"gdn", "mamba2", "kda", "mla"}
    assert MIXERS[MLP].gguf is not None  # every block's MLP
