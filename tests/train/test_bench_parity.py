"""`zebra bench parity`: what runs without a GPU (the recipe and data checks, the FLA-order batches, the weight
transfer into FLA's own class, the report files) on CPU, and the parity run itself on a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from zebra.bench.parity import ParityConfig, ParityReport, parity_batches, parity_recipe, write_parity
from zebra.data.fla_order import FlaOrder

from .helpers import write_fla_folder

SEQ = 64  # FLA's chunk size: the GPU kernels' tile


@pytest.fixture(scope="module")
def fla_folder(tmp_path_factory):
    return write_fla_folder(tmp_path_factory.mktemp("fla"), SEQ)


def _cfg(data, recipe="tiny-gdn", **kw) -> ParityConfig:
    return ParityConfig(recipe=recipe, data=str(data), overrides=[f"data.seq_len={SEQ}"], **kw)


def test_batches_are_the_chunks_in_flas_order_one_step_each(fla_folder):
    from zebra.data.indexed import open_dataset
    from zebra.data.manifest import read_manifest

    recipe = parity_recipe(_cfg(fla_folder, steps=3, batch=4))
    t = recipe.train
    assert (t.global_batch_size, t.micro_batch_size, t.max_steps, recipe.data.order) == (4, 4, 3, "fla")
    (shard,) = read_manifest(fla_folder).shards
    chunks = open_dataset(fla_folder / shard.prefix)
    rows = FlaOrder(len(chunks), 1, 4, 1).rows(range(12)).tolist()
    batches = parity_batches(recipe, 3)
    assert len(batches) == 3
    for s, batch in enumerate(batches):
        assert batch["tokens"].shape == (4, SEQ)
        for j in range(4):
            assert batch["tokens"][j].tolist() == chunks[rows[4 * s + j]].tolist()
        assert batch["loss_mask"][:, -1].eq(0).all() and batch["loss_mask"][:, :-1].eq(1).all()


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and all(n in errors[0] for n in needles), result.stderr


def test_parity_arguments_and_errors_are_one_line(cli, fla_folder, tmp_path):
    def parity(recipe, data, *extra):
        return cli("bench", "parity", recipe, "--data", str(data), "--steps", "2", "--batch", "4",
                   "--set", f"data.seq_len={SEQ}", "--output", str(tmp_path / "p"), *extra)  # fmt: skip

    _one_line_error(parity("tiny", fla_folder), "bench parity: recipe tiny has pattern")
    _one_line_error(parity("tiny-gdn", "@sample"), "@sample is not FLA data")
    _one_line_error(parity("tiny-gdn", fla_folder, "--set", "data.seq_len=32"), "holds 64-token chunks")
    _one_line_error(parity("tiny-gdn", fla_folder, "--set", "model.vocab_size=200"), "tokenized with 259 ids")
    if not torch.cuda.is_available():
        _one_line_error(parity("tiny-gdn", fla_folder), "bench parity: FLA's kernels need a GPU")
    assert not (tmp_path / "p").exists()
    usage = cli("bench", "parity", "tiny-gdn", "--steps", "2")
    assert usage.exit_code == 2 and "--data" in usage.output


@pytest.mark.parametrize("recipe_name", ["tiny-gdn", "tiny-kda", "tiny-gla"])
def test_fla_starts_from_zebras_initial_weights(recipe_name, tmp_path):
    from safetensors.torch import load_file

    from zebra.bench.train import fla_model
    from zebra.convert import convert
    from zebra.convert.fla_format import ZEBRA_TO_FLA, fla_state_dict
    from zebra.recipes import load_recipe
    from zebra.train.trainer import build_model

    recipe = load_recipe(recipe_name)
    zebra = build_model(recipe, torch.device("cpu"))
    fla = fla_model(recipe, torch.device("cpu"))
    assert any(
        not torch.equal(fla.state_dict()[ZEBRA_TO_FLA.rename(k)], v) for k, v in zebra.state_dict().items()
    )
    fla.load_state_dict(fla_state_dict(zebra.state_dict()), strict=True)
    for key, tensor in zebra.state_dict().items():
        assert torch.equal(fla.state_dict()[ZEBRA_TO_FLA.rename(key)], tensor), key

    zebra.save_pretrained(tmp_path / "zebra")  # and those are the tensors `zebra convert --to fla` writes
    convert(tmp_path / "zebra", "fla", tmp_path / "fla")
    exported = {
        k: v for f in sorted((tmp_path / "fla").glob("*.safetensors")) for k, v in load_file(f).items()
    }
    for key, tensor in exported.items():
        assert torch.equal(fla.state_dict()[key], tensor), key


def test_report_files_hold_both_curves_and_the_differences(tmp_path):
    from zebra.train.metrics import read_metrics

    report = ParityReport(recipe="tiny-gdn", data="d", device="cpu", precision="fp32", steps=3, batch=2, seq_len=SEQ,
                          params=1, fla_class="GatedDeltaNetForCausalLM", torch_version=torch.__version__,
                          zebra_loss=[5.0, 4.0, 3.03], fla_loss=[5.00001, 4.2, 3.0])  # fmt: skip
    files = write_parity(report, tmp_path / "out")
    saved = json.loads(files["json"].read_text())
    assert saved["step1_diff"] == pytest.approx(1e-5)
    assert saved["max_rel_diff"] == pytest.approx(0.2 / 4.2)
    assert saved["final_rel_diff"] == pytest.approx(0.01)
    assert saved["zebra_loss"] == [5.0, 4.0, 3.03] and saved["fla_loss"] == [5.00001, 4.2, 3.0]
    assert files["png"].stat().st_size > 1000 and files["png"].read_bytes()[:4] == b"\x89PNG"
    curve = read_metrics(tmp_path / "out" / "fla" / "metrics.jsonl")
    assert [(r["step"], r["loss"]) for r in curve] == [(1, 5.00001), (2, 4.2), (3, 3.0)]


@pytest.mark.gpu
def test_parity_run_on_a_gpu_agrees_at_step_one_in_fp32(cli, fla_folder, tmp_path):
    result = cli("bench", "parity", "tiny-gdn", "--data", str(fla_folder), "--steps", "20", "--batch", "4",
                 "--set", f"data.seq_len={SEQ}", "--set", "train.precision=fp32", "--output", str(tmp_path / "p"),
                 "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["fla_class"] == "GatedDeltaNetForCausalLM" and len(report["fla_loss"]) == 20
    assert report["step1_diff"] < 5e-5  # equal to 4 decimals: the same weights through two kernel sets
    assert report["max_rel_diff"] < 0.01 and report["zebra_loss"][-1] < report["zebra_loss"][0]
    assert (tmp_path / "p" / "parity.png").is_file() and (tmp_path / "p" / "parity.json").is_file()
    print(f"\nzebra bench parity tiny-gdn fp32, 20 steps: step-1 difference {report['step1_diff']:.2e}, "
          f"largest relative difference {report['max_rel_diff']:.2e}")  # fmt: skip
