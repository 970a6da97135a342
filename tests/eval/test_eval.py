"""`zebra eval` gives lm-eval's own numbers, offline, on a tiny model trained by `zebra train` and local tasks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from tests.generation.conftest import without_tokenizer
from typer.testing import CliRunner

from zebra.cli.main import app

LOCAL_TASKS = (
    "zebra_toy_mc,zebra_toy_ll"  # multiple choice (acc, acc_norm) and loglikelihood (perplexity, acc)
)
runner = CliRunner()


@pytest.mark.slow  # two full lm-eval runs of both tasks (one in a fresh process): ~150 s on the loaded 2 cores
def test_zebra_eval_equals_lm_eval_run_directly(run_dir, export, task_dir, tmp_path):
    """MODEL is the training run; lm-eval reads the run's HF export with nothing but transformers."""
    out_dir = tmp_path / "zebra"
    result = runner.invoke(
        app,
        [
            "eval", str(run_dir), "--tasks", LOCAL_TASKS, "--include-path", str(task_dir),
            "--device", "cpu", "--batch-size", "4", "--output", str(out_dir), "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ours = json.loads((out_dir / "results.json").read_text())["results"]

    # lm-eval's own CLI in a fresh process: the export loads through its remote code, zebra is never imported
    direct_dir = tmp_path / "direct"
    subprocess.run(
        [
            sys.executable, "-m", "lm_eval", "--model", "hf",
            "--model_args", f"pretrained={export},trust_remote_code=True",
            "--tasks", LOCAL_TASKS, "--include_path", str(task_dir),
            "--device", "cpu", "--batch_size", "4", "--output_path", str(direct_dir),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    direct = json.loads(next(direct_dir.rglob("results_*.json")).read_text())["results"]

    for task in ("zebra_toy_mc", "zebra_toy_ll"):
        metrics = {k: v for k, v in direct[task].items() if "," in k and not k.startswith(("alias", "name"))}
        assert {k: ours[task][k] for k in metrics} == metrics
    assert set(ours["zebra_toy_mc"]) >= {"acc,none", "acc_norm,none"}
    assert set(ours["zebra_toy_ll"]) >= {"perplexity,none", "acc,none"}
    rows = json.loads(result.stdout)["rows"]
    assert {(r["task"], r["metric"]) for r in rows} == {
        ("zebra_toy_mc", "acc"), ("zebra_toy_mc", "acc_norm"), ("zebra_toy_ll", "acc"), ("zebra_toy_ll", "perplexity")
    }  # fmt: skip


def test_table_output_and_limit(export, task_dir, tmp_path):
    """On a copy of the export whose config.json names the fla backend (no CPU path): the CPU's kernels run."""
    fla = shutil.copytree(export, tmp_path / "fla-backend")
    config = json.loads((fla / "config.json").read_text())
    (fla / "config.json").write_text(json.dumps({**config, "kernel_backend": "fla"}))
    result = runner.invoke(
        app,
        ["eval", str(fla), "--tasks", "zebra_toy_mc", "--include-path", str(task_dir), "--device", "cpu",
         "--batch-size", "2", "--limit", "3"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "zebra_toy_mc" in result.stdout and "acc_norm" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "no_such_task_xyz"], "--tasks no_such_task_xyz: not an lm-eval task"),
        (
            ["--tasks", "arc_easy"],
            "--tasks arc_easy: its dataset is not cached and the Hugging Face Hub cannot be reached",
        ),
        (["--tasks", "zebra_toy_mc", "--batch-size", "zero"], "--batch-size zero"),
        (["--tasks", "zebra_toy_mc", "--dtype", "int8"], "--dtype int8: unknown"),
        (["--tasks", "zebra_toy_mc", "--device", "cuda"], "--device cuda: no CUDA device"),
        (["--tasks", "missing.yaml"], "--tasks missing.yaml: no such task file"),
    ],
)
def test_bad_input_is_one_line(export, task_dir, args, message):
    result = runner.invoke(
        app, ["eval", str(export), "--include-path", str(task_dir), "--device", "cpu", *args]
    )
    assert result.exit_code == 1
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_an_unknown_task_suggests_names_spelled_alike():
    """`piqaa` holds no known name, yet `piqa` is one letter away."""
    from zebra.core.errors import ZebraError
    from zebra.eval.tasks import load_tasks, task_manager

    with pytest.raises(ZebraError) as raised:
        load_tasks(["piqaa"], task_manager())
    assert raised.value.message == "--tasks piqaa: not an lm-eval task, group or tag"
    assert raised.value.fix.startswith("did you mean one of: piqa, ")


def test_an_unknown_task_names_a_yaml_of_the_include_path_that_does_not_parse(tmp_path):
    """lm-eval's index skips a task YAML it cannot parse without a word: the error names it and its line."""
    from zebra.core.errors import ZebraError
    from zebra.eval.tasks import load_tasks, task_manager

    bad = tmp_path / "bad.yaml"
    bad.write_text('task: audit_bad\ndataset_path: json\ndoc_to_text: "{{q}\n  doc_to_choice: x\n')
    with pytest.raises(ZebraError) as raised:
        load_tasks(["audit_bad"], task_manager([tmp_path]))
    assert raised.value.message == (
        f"--tasks audit_bad: not an lm-eval task, group or tag; lm-eval left out {bad}, which is not a valid "
        "task YAML (line 3: while scanning a quoted scalar, found unexpected end of stream)"
    )
    assert raised.value.fix.startswith(f"fix {bad} there")


def task_yaml_like_toy_mc(task_dir, folder, replace: dict[str, str]):
    """A copy of the zebra_toy_mc task YAML (absolute data path) with some text replaced."""
    text = (task_dir / "zebra_toy_mc.yaml").read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = folder / "task.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("replace", "message", "fix"),
    [
        (
            {"task: zebra_toy_mc": 'task: "zebra_toy_mc'},
            "not a valid task YAML (line {line}: while scanning a quoted scalar, found unexpected end of stream)",
            "fix the YAML at that line",
        ),
        (
            {"{{question}}": "{{questionz}}"},
            "doc_to_text reads a field the documents lack ('questionz' is undefined)",
            "the templates can read only the dataset's own fields",
        ),
        (
            {"{{choices}}": "{{choices}"},
            "doc_to_choice is not a valid Jinja template (unexpected '}')",
            "{{ field }} inserts a document's field",
        ),
        (
            {"output_type: multiple_choice": "output_type: multiple_choise"},
            "cannot build the task (Got invalid output_type 'multiple_choise'",
            "fix the task YAML",
        ),
    ],
    ids=["yaml", "undefined-field", "template-syntax", "output-type"],
)
def test_a_bad_task_yaml_by_path_is_one_line_naming_the_key(task_dir, tmp_path, replace, message, fix):
    from zebra.core.errors import ZebraError
    from zebra.eval.tasks import load_tasks, task_manager

    path = task_yaml_like_toy_mc(task_dir, tmp_path, replace)
    text = path.read_text()
    line = text[: text.index(next(iter(replace.values())))].count("\n") + 1  # where the replaced text starts
    with pytest.raises(ZebraError) as raised:
        load_tasks([str(path)], task_manager())
    assert raised.value.message.startswith(f"--tasks {path}: {message.replace('{line}', str(line))}")
    assert raised.value.fix.startswith(fix)


def test_a_template_that_fails_on_a_later_document_is_one_line(export, task_dir, tmp_path):
    """lm-eval renders the first document when it builds a task, every document while it evaluates: the second
    document here has two choices, so `{{choices[2]}}` fails only in the evaluation, after the model loaded."""
    data = tmp_path / "later.jsonl"
    rows = [
        {"question": "a?", "choices": ["x", "y", "z"], "answer": 0},
        {"question": "b?", "choices": ["x", "y"], "answer": 1},
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = (task_dir / "zebra_toy_mc.yaml").read_text()
    path = task_yaml_like_toy_mc(
        task_dir,
        tmp_path,
        {"{{question}}": "{{question}} or {{choices[2]}}", text.split("test: ")[1].split("\n")[0]: str(data)},
    )
    result = runner.invoke(
        app, ["eval", str(export), "--tasks", str(path), "--device", "cpu", "--batch-size", "2"]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: --tasks {path}: a template reads a field the documents lack (list object has no element 2)"
    ]


def test_outside_a_git_repository_stderr_holds_no_git_message(export, task_dir, tmp_path):
    """lm-eval runs `git describe` for the results' git_hash: git's 'fatal: not a git repository' stays hidden."""
    import os

    env = os.environ | {"GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}  # git looks no higher than tmp_path
    done = subprocess.run(
        [sys.executable, "-m", "zebra.cli.main", "eval", str(export), "--tasks", "zebra_toy_mc", "--include-path",
         str(task_dir), "--device", "cpu", "--batch-size", "2", "--limit", "2", "--output", "out"],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not a git repository" not in done.stderr
    assert json.loads((tmp_path / "out" / "results.json").read_text())["git_hash"] is None


def test_bad_model_dir_is_one_line(tmp_path):
    result = runner.invoke(app, ["eval", str(tmp_path), "--tasks", "zebra_toy_mc"])
    assert result.exit_code == 1
    assert "no config.json" in result.stderr


def test_preset_expands_to_the_guides_suite():
    from zebra.eval import ZEBRA_SUITE, expand_tasks

    assert expand_tasks("zebra") == list(ZEBRA_SUITE)
    assert expand_tasks("piqa,zebra,piqa")[0] == "piqa" and len(expand_tasks("piqa,zebra,piqa")) == 8


def test_run_without_export_is_exported_from_its_latest_checkpoint(run_dir, tmp_path):
    import shutil

    from zebra.generation.loading import resolve_model_dir

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("export", "data_cache", "tensorboard"))
    resolved = resolve_model_dir(run)
    assert resolved.source == "run" and resolved.path == run / "export"
    assert (run / "export" / "model.safetensors").is_file()
    assert resolved.model_type == "zebra"


def test_a_run_whose_export_is_older_than_its_newest_checkpoint_is_exported_again(run_dir, tmp_path):
    """A run that trained on after its export (or is training now): chat, generate and eval load the newest
    checkpoint, not the stale export, and say so once."""
    import os
    import shutil

    from zebra.folders.checkpoint_dir import committed
    from zebra.generation.loading import load_model, resolve_model_dir

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("data_cache", "tensorboard"))
    stale = run / "export" / "model.safetensors"
    stale.write_bytes(b"weights of an older step")
    an_hour_ago = (run / "export" / "config.json").stat().st_mtime - 3600
    os.utime(run / "export" / "config.json", (an_hour_ago, an_hour_ago))
    newest = committed(run / "checkpoints")[0]

    notes: list[str] = []
    model, _ = load_model(run, device="cpu", with_tokenizer=False, on_note=notes.append)  # loads: re-exported
    assert notes == [
        f"{run}: exporting its newest checkpoint to {run / 'export'} ({newest.name} is newer than the export)"
    ]
    assert model.config.num_hidden_layers > 0
    assert (
        resolve_model_dir(run, on_note=notes.append).path == run / "export" and len(notes) == 1
    )  # now current


def test_an_export_without_tokenizer_files_names_the_flag_and_takes_it(export, task_dir, tmp_path):
    """`zebra eval DIR` on an export converted without a tokenizer (issue 17 item 2)."""
    bare = without_tokenizer(export, tmp_path / "bare")
    result = runner.invoke(app, ["eval", str(bare)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: MODEL {bare}: no tokenizer files (tokenizer.json, tokenizer_config.json)"
    ]
    assert "pass --tokenizer" in result.stderr

    args = [
        "--tasks",
        LOCAL_TASKS,
        "--include-path",
        str(task_dir),
        "--device",
        "cpu",
        "--limit",
        "4",
        "--json",
    ]
    given = runner.invoke(app, ["eval", str(bare), "--tokenizer", "byte", *args])
    own = runner.invoke(app, ["eval", str(export), *args])  # the export's own tokenizer is the byte one
    assert given.exit_code == 0 and own.exit_code == 0, given.output + own.output
    assert json.loads(given.stdout)["rows"] == json.loads(own.stdout)["rows"]
