"""`zebra convert` / `zebra verify` through the CLI: results, JSON, and one-line errors that leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from convert_helpers import build_model, write_run
from megatron_writer import megatron_args, megatron_tensors, write_torch
from typer.testing import CliRunner

from cli_results import assert_one_line_error
from zebra.cli.main import app
from zebra.convert import export_hf


def zebra(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def listing(path):
    """Every name under `path`, hidden temporary folders included."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture
def gdn_export(tmp_path):
    recipe, model = build_model("gdn")
    return export_hf(model.state_dict(), recipe, tmp_path / "zebra")


def test_convert_and_verify_a_primus_checkpoint(tmp_path):
    _, model = build_model("mamba-mla")
    src = write_torch(tmp_path / "primus", model, "*-M-M-M-", te=True)

    r = zebra("convert", src, "--output", tmp_path / "out", "--tokenizer", "byte")
    assert r.exit_code == 0, r.output
    assert "megatron-torch" in r.stdout and "*-M-M-M-" in r.stdout

    r = zebra("verify", tmp_path / "out", "--against", src, "--json", "--max-new-tokens", "4")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["ok"] and all(a["ok"] for a in report["audits"])
    (parity,) = report["parity"]
    assert parity["max_abs"] == 0.0 and parity["cosine"] > 0.999999
    assert len(report["top5"]) == 5 and len(report["continuation_ids"]) == 4

    r = zebra("verify", tmp_path / "out", "--against", src, "-p", "Hi", "--max-new-tokens", "1")  # human view
    assert r.exit_code == 0, r.output
    assert "Logits parity" in r.stdout and "rel <= 0.0001" in r.stdout and "verified" in r.stdout


def test_verify_fails_with_exit_1_when_logits_differ(tmp_path, gdn_export):
    _, other = build_model("gdn", seed=5)
    different = export_hf(other.state_dict(), other.config, tmp_path / "other", tokenizer="byte")
    r = zebra("verify", different, "--against", gdn_export, "--json")
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    assert report["audits"][0]["ok"] and not report["parity"][0]["ok"]


def test_verify_against_a_model_of_another_vocabulary_fails_the_check_in_one_line(tmp_path, gdn_export):
    """Used to end in 'RuntimeError: The size of tensor a ... must match' with the bug hint."""
    recipe, other = build_model("gdn", extra=("model.vocab_size=300",))
    different = export_hf(other.state_dict(), recipe, tmp_path / "other")
    r = zebra("verify", gdn_export, "--against", different, "--json")
    assert r.exit_code == 1, r.output
    (parity,) = json.loads(r.stdout)["parity"]
    assert not parity["ok"] and parity["problem"] == "vocabularies differ (300 vs 272)"
    r = zebra("verify", gdn_export, "--against", different)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"logits not compared with {different}: vocabularies differ (300 vs 272)" in r.output
    assert "verification failed" in r.output


def test_verify_refuses_an_empty_prompt_in_one_line(gdn_export):
    """An empty --prompt became an empty float tensor of token ids and crashed the forward."""
    r = zebra("verify", gdn_export, "--prompt", "")
    assert_one_line_error(r, "--prompt '': an empty prompt")


def test_verify_fails_on_weights_that_make_nan_logits(tmp_path, gdn_export):
    """Corrupt data bytes (NaN weights) used to pass `zebra verify DIR` with '✓ verified'."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(gdn_export / "model.safetensors")
    tensors["model.layers.1.mixer.up_proj.weight"][0, 0] = float("nan")
    save_file(tensors, gdn_export / "model.safetensors", metadata={"format": "pt"})
    r = zebra("verify", gdn_export, "--json", "--max-new-tokens", "1")
    assert r.exit_code == 1, r.output
    (problem,) = json.loads(r.stdout)["problems"]
    assert (
        "logits hold NaN or infinite values" in problem and "model.layers.1.mixer.up_proj.weight" in problem
    )
    r = zebra("verify", gdn_export, "--max-new-tokens", "1")
    assert r.exit_code == 1 and "logits hold NaN" in r.output and "verification failed" in r.output


def test_verify_names_missing_tensors(tmp_path, gdn_export):
    from safetensors.torch import load_file, save_file

    tensors = load_file(gdn_export / "model.safetensors")
    del tensors["model.layers.2.mixer.o_norm.weight"]
    save_file(tensors, gdn_export / "model.safetensors", metadata={"format": "pt"})
    r = zebra("verify", gdn_export, "--json")
    assert r.exit_code != 0
    assert "model.layers.2.mixer.o_norm.weight" in r.output


def test_verify_fla_dir_on_cpu_audits_fla_classes_and_says_how_logits_ran(tmp_path, gdn_export):
    assert zebra("convert", gdn_export, "--to", "fla", "-o", tmp_path / "fla").exit_code == 0
    r = zebra("verify", tmp_path / "fla", "--against", gdn_export, "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["audits"][0]["target"] == "GatedDeltaNetForCausalLM (FLA)"
    assert "CPU: FLA classes used for the audit only" in report["mode"]
    assert report["parity"][0]["max_abs"] == 0.0


def test_truncated_safetensors(tmp_path, gdn_export):
    shard = gdn_export / "model.safetensors"
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 1000)
    r = zebra("convert", gdn_export, "--to", "fla", "-o", tmp_path / "out")
    assert_one_line_error(r, "model.safetensors: unreadable safetensors file", "truncated")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zebra"]


def test_truncated_torch_checkpoint(tmp_path):
    _, model = build_model("gdn")
    root = write_torch(tmp_path / "primus", model, "G-G-", te=False)
    pt = root / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt"
    with open(pt, "r+b") as f:
        f.truncate(os.path.getsize(pt) // 2)
    r = zebra("convert", root, "-o", tmp_path / "out")
    assert_one_line_error(r, "model_optim_rng.pt: unreadable torch checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["primus"]


def test_unknown_architecture(tmp_path):
    """A GPT layer (fused linear_qkv attention) is not a layer kind zebra knows."""
    _, model = build_model("mamba-mla")
    tensors = megatron_tensors(model, "*-M-M-M-", te=True)
    tensors["decoder.layers.0.self_attention.linear_qkv.weight"] = torch.zeros(192, 64)
    d = tmp_path / "gpt" / "iter_0000001" / "mp_rank_00"
    d.mkdir(parents=True)
    torch.save(
        {"model": tensors, "args": megatron_args(model, "*-M-M-M-"), "iteration": 1}, d / "model_optim_rng.pt"
    )
    r = zebra("convert", d.parent, "-o", tmp_path / "out")
    assert_one_line_error(r, "unexpected tensor decoder.layers.0.self_attention.linear_qkv.weight", "Primus")
    assert not (tmp_path / "out").exists()


def test_unknown_format(tmp_path):
    (tmp_path / "weird").mkdir()
    (tmp_path / "weird" / "weights.npz").write_bytes(b"x")
    assert_one_line_error(zebra("convert", tmp_path / "weird"), "unknown checkpoint format")
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    assert_one_line_error(zebra("convert", tmp_path / "llama"), "model_type 'llama'")


def test_tensor_shape_conflict(tmp_path):
    _, model = build_model("gdn")
    tensors = megatron_tensors(model, "G-G-", te=True)
    key = "decoder.layers.0.mixer.in_proj.weight"
    tensors[key] = torch.cat([tensors[key], torch.zeros(8, 64)])
    d = tmp_path / "p" / "iter_0000001" / "mp_rank_00"
    d.mkdir(parents=True)
    torch.save(
        {"model": tensors, "args": megatron_args(model, "G-G-"), "iteration": 1}, d / "model_optim_rng.pt"
    )
    r = zebra("convert", d.parent, "-o", tmp_path / "out")
    assert_one_line_error(r, f"{key} has shape [208, 64]", "gdn_key=32")
    assert not (tmp_path / "out").exists()


def test_hybrid_to_fla(tmp_path):
    recipe, model = build_model("hybrid")
    src = export_hf(model.state_dict(), recipe, tmp_path / "zebra")
    r = zebra("convert", src, "--to", "fla", "-o", tmp_path / "fla")
    assert_one_line_error(r, "'*-M-G-K-' is a hybrid", "--to hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zebra"]


def test_existing_output_needs_force(tmp_path, gdn_export):
    out = tmp_path / "fla"
    assert zebra("convert", gdn_export, "--to", "fla", "-o", out).exit_code == 0
    before = (out / "config.json").stat().st_mtime_ns
    r = zebra("convert", gdn_export, "--to", "fla", "-o", out)
    assert_one_line_error(r, "already exists", "--force")
    assert (out / "config.json").stat().st_mtime_ns == before
    r = zebra("convert", gdn_export, "--to", "fla", "-o", out, "--force")
    assert r.exit_code == 0, r.output
    assert (out / "config.json").stat().st_mtime_ns != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fla", "zebra"]  # no temporary or old folder left


@pytest.mark.parametrize("flags", [[], ["--force"], ["--yes"]])
def test_force_never_replaces_a_folder_that_is_not_a_model(tmp_path, gdn_export, flags):
    """A data or home folder given as --output by mistake: replacing it would delete what is in it."""
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = zebra("convert", gdn_export, "--to", "fla", "-o", out, *flags)
    assert_one_line_error(r, "holds files but no config.json", "choose another path")
    assert listing(out) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_convert_json(tmp_path, gdn_export):
    r = zebra("convert", gdn_export, "--to", "fla", "-o", tmp_path / "fla", "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["source_format"] == "hf" and result["target"] == "fla" and result["pattern"] == "G-G-"


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_truncated_distcp_fails_mid_write_and_leaves_nothing(tmp_path, damage):
    """The tensor data is read while the output is being written: the temporary folder must go too. The error
    shows the exception and the .distcp file (it showed torch's `(exception, stack)` tuple)."""
    from megatron_writer import write_torch_dist

    _, model = build_model("kda")
    root = write_torch_dist(tmp_path / "primus", model, "K-K-", te=True)
    for data in (root / "iter_0000100").glob("*.distcp"):
        if damage == "delete":
            data.unlink()
            continue
        with open(data, "r+b") as f:
            f.truncate(os.path.getsize(data) // 3)
    r = zebra("convert", root, "-o", tmp_path / "out", "--tokenizer", "none")
    line = assert_one_line_error(r, "iter_0000100: cannot read", ".distcp")
    assert "tuple" not in line and "FrameSummary" not in line
    assert ("FileNotFoundError" if damage == "delete" else "Error") in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["primus"]


@pytest.mark.parametrize(
    ("output", "where"),
    [(".", "is the source"), ("checkpoints", "is inside the source"), ("..", "contains the source")],
)
def test_an_output_overlapping_the_source_is_refused_even_with_yes(tmp_path, output, where):
    """`zebra convert SRC -o SRC --yes` used to write the export and then delete the whole run."""
    recipe, model = build_model("gdn")
    run = tmp_path / "runs" / "gdn"
    write_run(run, recipe, model)
    before = listing(tmp_path)
    r = zebra("convert", run, "-o", run / output, "--yes")
    assert_one_line_error(r, where, "choose an output outside")
    assert listing(tmp_path) == before


def test_a_run_converts_into_its_own_export_folder(tmp_path):
    recipe, model = build_model("gdn")
    run = tmp_path / "gdn"
    write_run(run, recipe, model)
    r = zebra("convert", run, "-o", run / "export", "--yes")
    assert r.exit_code == 0, r.output
    assert (run / "export" / "config.json").is_file() and (run / "checkpoints").is_dir()


def gdn_runs(root, *names):
    """GDN training runs under ROOT/runs, each checkpoint a minute older than the one before."""
    recipe, model = build_model("gdn")
    for age, name in enumerate(names):
        step = write_run(root / "runs" / name, recipe, model)
        os.utime(step, (time.time() - 60 * age, time.time() - 60 * age))


def test_convert_without_source_takes_the_run_under_runs(tmp_path, monkeypatch):
    """The used-by line, `zebra convert --to fla`, after one `zebra train` (issue 17 item 3)."""
    gdn_runs(tmp_path, "gdn")
    monkeypatch.chdir(tmp_path)
    r = zebra("convert", "--to", "fla")
    assert r.exit_code == 0, r.output
    assert "runs/gdn (zebra, step 20) -> runs/gdn-fla (fla)" in r.stdout
    assert (tmp_path / "runs" / "gdn-fla" / "config.json").is_file()


def test_convert_without_source_and_several_runs_lists_them_or_takes_the_newest_with_yes(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(zebra("convert", "--to", "fla"), "missing SOURCE", "pass SOURCE")  # no run at all
    gdn_runs(tmp_path, "new", "old")
    r = zebra("convert", "--to", "fla")
    assert_one_line_error(r, "missing SOURCE, and there are 2 candidates", "pass one of: runs/new, runs/old")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["new", "old"]
    r = zebra("convert", "--to", "fla", "--yes")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["new", "new-fla", "old"]


def test_convert_without_source_on_a_terminal_offers_the_runs(tmp_path):
    import pexpect

    gdn_runs(tmp_path, "new", "old")
    child = pexpect.spawn(
        sys.executable, ["-m", "zebra.cli.main", "convert", "--to", "fla"], cwd=tmp_path, encoding="utf-8",
        codec_errors="replace", timeout=180, dimensions=(50, 250),
    )  # fmt: skip
    child.expect("Convert which run")
    child.expect_exact("runs/old")  # both are offered, the newest first
    child.send("\x1b[B\r")  # arrow down: the older one
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["new", "old", "old-fla"]


def test_a_live_run_pruning_its_checkpoints_converts_the_step_it_read(tmp_path, monkeypatch):
    """The trainer's keep_last pruning used to delete the checkpoint `convert` was reading ('a .distcp file is
    truncated or missing'): it now leaves a checkpoint being read, and convert says which step it converted."""
    from zebra.convert.tensor_sources import DCPSource
    from zebra.folders.checkpoint_dir import committed
    from zebra.train.checkpoint import Checkpointer
    from zebra.train.dist import DistEnv

    recipe, model = build_model("gdn")
    run = tmp_path / "run"
    write_run(run, recipe, model, step=20)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    trainer = Checkpointer(run, keep_last=1, env=env)
    state = {"model": model.state_dict(), "progress": {"step": torch.tensor(0)}}
    get, saved = DCPSource.get, []

    def get_while_training(self, name):
        if not saved:  # the run saves step 40 (keep_last=1) while step 20 is being converted
            saved.append(trainer.save(40, state, {}))
        return get(self, name)

    monkeypatch.setattr(DCPSource, "get", get_while_training)
    r = zebra("convert", run, "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["step"] == 20
    assert [p.name for p in committed(run / "checkpoints")] == ["step_0000040", "step_0000020"]
    trainer.save(60, state, {})  # released: the next save prunes it
    assert [p.name for p in committed(run / "checkpoints")] == ["step_0000060"]

    r = zebra("convert", run, "-o", tmp_path / "out2")
    assert r.exit_code == 0, r.output
    assert "(zebra, step 60) ->" in r.stdout


TERMINATED_MID_WRITE = """
import os, signal, sys
import zebra.convert.writer as hf
real = hf.write_safetensors
def write_terminated(*args, **kwargs):  # SIGTERM lands in Python code right after: the output half-written
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
hf.write_safetensors = write_terminated
from zebra.cli.main import main
sys.argv = ["zebra", *sys.argv[1:]]
main()
"""


def run_terminated_mid_write(*args):
    """`zebra ARGS` in a child process that sends itself SIGTERM while it writes the output's weights."""
    return subprocess.run(
        [sys.executable, "-c", TERMINATED_MID_WRITE, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_sigterm_during_convert_removes_the_temporary_output_and_says_so(tmp_path, gdn_export):
    """SIGTERM (a job scheduler, `kill`) ended convert with status 143, no message and a `.out.tmp-PID` folder."""
    r = run_terminated_mid_write("convert", gdn_export, "-o", tmp_path / "out")
    assert r.returncode == 143, r.stderr
    assert "Traceback" not in r.stderr and "zebra convert: terminated (SIGTERM)" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zebra"]
