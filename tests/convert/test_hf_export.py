"""Zebra training run -> HF export -> Zebra export: exact, loadable without zebra, laid out as design.md says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from convert_helpers import build_model, load_zebra, logits, tokens, write_run
from safetensors.torch import load_file

from zebra.convert import convert, export_hf, export_run
from zebra.core.errors import ZebraError


def test_run_to_hf_to_zebra_is_bitwise(tmp_path):
    recipe, model = build_model("hybrid")
    run = tmp_path / "run"
    write_run(run, recipe, model)

    export = export_run(run)
    assert export == run / "export"
    again = convert(export, "zebra", tmp_path / "again").output

    original = model.state_dict()
    first, second = load_file(export / "model.safetensors"), load_file(again / "model.safetensors")
    assert set(first) == set(original) - {"lm_head.weight"}  # tied: saved once
    for name, tensor in first.items():
        assert torch.equal(tensor, original[name]) and torch.equal(second[name], tensor), name
    ids = tokens()
    torch.testing.assert_close(logits(load_zebra(again), ids), logits(model, ids), rtol=0, atol=0)


def test_export_layout(tmp_path):
    recipe, model = build_model("hybrid", extra=("model.kernel_backend=torch",))
    out = export_hf(model.state_dict(), recipe, tmp_path / "export", max_shard_size="100KB")

    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "README.md", "model.safetensors.index.json"} <= names
    assert {"configuration_zebra.py", "modeling_zebra.py", "tokenizer.json"} <= names
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert "lm_head.weight" not in index["weight_map"]
    for shard in shards:  # no shard is over the limit unless one tensor alone is
        size = os.path.getsize(out / shard)
        assert size <= 100_000 + 10_000 or len(load_file(out / shard)) == 1
    cfg = json.loads((out / "config.json").read_text())
    assert (
        cfg["model_type"] == "zebra"
        and cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_zebra.ZebraForCausalLM"
    )
    assert cfg["eos_token_id"] == 256
    assert cfg["kernel_backend"] == "auto"  # the run's torch reference stays with the run
    card = (out / "README.md").read_text()
    assert "*-M-G-K-" in card and "trust_remote_code=True" in card and "lr:" in card
    ids = tokens()
    torch.testing.assert_close(logits(load_zebra(out), ids), logits(model, ids), rtol=0, atol=0)


def test_dtype_cast_and_bf16_round_trip(tmp_path):
    recipe, model = build_model("gdn")
    out = export_hf(model.state_dict(), recipe, tmp_path / "bf16", dtype="bf16")
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    back = convert(out, "hf", tmp_path / "back").output
    a, b = load_file(out / "model.safetensors"), load_file(back / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", ["hybrid", "gla"])
def test_export_loads_with_trust_remote_code_without_zebra(tmp_path, kind):
    recipe, model = build_model(kind)
    out = export_hf(model.state_dict(), recipe, tmp_path / "export")
    ids = tokens()
    torch.save({"ids": ids, "logits": logits(model, ids)}, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["zebra"] = None          # zebra and its kernels are not importable here
        sys.modules["zebra_kernels"] = None
        import torch
        from transformers import AutoModelForCausalLM
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        model = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            got = model(input_ids=expected["ids"]).logits
        torch.testing.assert_close(got, expected["logits"], rtol=0, atol=0)
        print("OK", type(model).__name__)
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "OK ZebraForCausalLM" in run.stdout


def test_missing_or_mis_shaped_tensors_write_nothing(tmp_path):
    recipe, model = build_model("gdn")
    sd = model.state_dict()
    broken = {k: v for k, v in sd.items() if k != "model.layers.0.mixer.q_proj.weight"}
    with pytest.raises(ZebraError, match=r"missing model\.layers\.0\.mixer\.q_proj\.weight"):
        export_hf(broken, recipe, tmp_path / "a")
    wrong = {**sd, "model.layers.0.mixer.q_proj.weight": torch.zeros(3, 64)}
    with pytest.raises(ZebraError, match=r"q_proj\.weight is \[3, 64\], ZebraForCausalLM expects \[32, 64\]"):
        export_hf(wrong, recipe, tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(tmp_path):
    recipe, model = build_model("gdn")
    out = export_hf(model.state_dict(), recipe, tmp_path / "export")
    before = (out / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(ZebraError, match="already exists"):
        export_hf(model.state_dict(), recipe, out)
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    export_hf(model.state_dict(), recipe, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temp or backup folder left


def test_force_replaces_an_empty_or_model_folder_only(tmp_path):
    recipe, model = build_model("gdn")
    (tmp_path / "empty").mkdir()
    export_hf(model.state_dict(), recipe, tmp_path / "empty", force=True)  # nothing to lose
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard.bin").write_bytes(b"tokens")
    with pytest.raises(ZebraError, match=r"holds files but no config\.json"):
        export_hf(model.state_dict(), recipe, tmp_path / "data", force=True)
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["shard.bin"]


def test_the_library_refuses_to_export_a_run_into_its_checkpoints(tmp_path):
    recipe, model = build_model("gdn")
    run = tmp_path / "run"
    write_run(run, recipe, model)
    with pytest.raises(ZebraError, match="is inside the source"):
        convert(run, "hf", run / "checkpoints", force=True)
    assert (run / "checkpoints" / "latest").is_file()
