"""`zebra upcycle` through the CLI: the provenance table, JSON, one-line errors, and an export the other commands use."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli_results import assert_one_line_error
from zebra.cli.main import app

from .teachers import tiny_llama


def zebra(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "220"})


@pytest.fixture
def teacher(tmp_path):
    return tiny_llama(tmp_path / "llama")


def test_upcycle_prints_where_every_tensor_came_from_and_the_export_generates(tmp_path, teacher):
    out = tmp_path / "student"
    result = zebra("upcycle", teacher, "--output", out, "--mixer", "gdn", "--mla-layers", "1")
    assert result.exit_code == 0, result.output
    for needle in ("model.layers.2.mixer.kv_up_proj.weight", "svd: SVD rank", "repeated: each KV head x2",
                   "pattern G-*-", "KV cache", "upcycle.json"):  # fmt: skip
        assert needle in result.stdout, result.stdout
    report = json.loads((out / "upcycle.json").read_text())
    assert report["pattern"] == "G-*-" and report["mla_layers"] == [1]
    generated = zebra("generate", out, "--prompt", "zebra", "--max-new", "4", "--device", "cpu")
    assert generated.exit_code == 0, generated.output


def test_upcycle_json_is_the_report(tmp_path, teacher):
    result = zebra("upcycle", teacher, "--output", tmp_path / "student", "--mixer", "kda", "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == json.loads((tmp_path / "student" / "upcycle.json").read_text())
    assert printed["counts"]["repeated"] == 2 and printed["mixer"] == "kda"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--kv-lora-rank", "100"], ["--kv-lora-rank 100 is above the rank of [W_k; W_v] (64"]),
        (["--mla-layers", "0,7"], ["layer 7 is outside 0..1"]),
        (["--mla", "3"], ["--mla 3: must be between 0 and 2"]),
        (
            ["--recipe", "1b-gdn-pure"],
            [
                "does not fit the teacher",
                "hidden_size 2048 (teacher: 64)",
                "model.num_layers 32 = 16 layers (teacher: 2 layers)",
            ],
        ),
        (["--dtype", "int8"], ["--dtype int8: unknown"]),
    ],
)
def test_bad_options_are_one_line_errors_that_write_nothing(tmp_path, teacher, args, needles):
    result = zebra("upcycle", teacher, "--output", tmp_path / "student", *args)
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "student").exists()


def test_an_existing_output_needs_force(tmp_path, teacher):
    (tmp_path / "student").mkdir()
    assert_one_line_error(zebra("upcycle", teacher, "--output", tmp_path / "student"), "already exists")
    assert zebra("upcycle", teacher, "--output", tmp_path / "student", "--force").exit_code == 0
    replaced = zebra("upcycle", teacher, "--output", tmp_path / "student", "--yes")  # a model folder now
    assert replaced.exit_code == 0
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    result = zebra("upcycle", teacher, "--output", tmp_path / "notes", "--force")
    assert_one_line_error(result, "holds files but no config.json")  # told before the teacher is read
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep"


def test_a_missing_teacher_is_one_line(tmp_path):
    result = zebra("upcycle", tmp_path / "nothing.gguf", "--output", tmp_path / "student")
    assert_one_line_error(result, "nothing.gguf: no such file")


@pytest.mark.parametrize(
    ("name", "content"),
    [("notes.txt", b"hi\n"), ("weights.pt", bytes(range(256)) * 20)],
    ids=["text", "bytes"],
)
def test_a_teacher_file_that_is_no_checkpoint_is_one_line(tmp_path, name, content):
    """Any file that is neither a .gguf nor a torch checkpoint: whatever torch.load raises on those bytes (a
    ValueError; for "hi", a KeyError: its legacy unpickler reads "h" as a memo lookup of index "i") becomes a
    one-line error naming the file, and nothing is written."""
    (tmp_path / name).write_bytes(content)
    result = zebra("upcycle", tmp_path / name, "--output", tmp_path / "student")
    assert_one_line_error(result, f"{name}: unreadable torch checkpoint")
    assert not (tmp_path / "student").exists()


def test_sigterm_during_upcycle_removes_the_temporary_output_and_says_so(tmp_path, teacher):
    """SIGTERM ended upcycle with status 143, no message and a large `.student.tmp-PID` folder left behind."""
    import os
    import subprocess
    import sys

    script = (  # the child sends itself SIGTERM while it writes the student's weights
        "import os, signal, sys\n"
        "import zebra.convert.writer as hf\n"
        "real = hf.write_safetensors\n"
        "def write_terminated(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(*args, **kwargs)\n"
        "hf.write_safetensors = write_terminated\n"
        "from zebra.cli.main import main\n"
        "sys.argv = ['zebra', *sys.argv[1:]]\n"
        "main()\n"
    )
    args = ["upcycle", str(teacher), "--output", str(tmp_path / "student"), "--mixer", "gdn"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env)
    assert r.returncode == 143, r.stderr
    assert "Traceback" not in r.stderr and "zebra upcycle: terminated (SIGTERM)" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]
