"""A folder's config.json is read one way: format detection (convert, verify) and model loading (eval, chat,
generate, bench decode) name a broken one alike; an output folder is replaced only when it is empty or a model."""

from __future__ import annotations

import pytest

from zebra.core.errors import ZebraError
from zebra.folders.model_folder import check_output, config_model_type


@pytest.mark.parametrize(
    ("text", "model_type"), [(None, None), ('{"model_type": "zebra"}', "zebra"), ("{}", None)]
)
def test_the_model_type_of_a_folder(tmp_path, text, model_type):
    if text is not None:
        (tmp_path / "config.json").write_text(text)
    assert config_model_type(tmp_path) == model_type


@pytest.mark.parametrize(("text", "message"), [("{not json", "not valid JSON"), ("[1]", "not a JSON object")])
def test_a_broken_config_is_the_same_one_line_for_convert_and_for_loading(tmp_path, text, message):
    from zebra.convert.formats import detect_format
    from zebra.generation.loading import resolve_model_dir

    (tmp_path / "config.json").write_text(text)
    errors = []
    for read in (config_model_type, detect_format, resolve_model_dir):
        with pytest.raises(ZebraError) as info:
            read(tmp_path)
        errors.append((info.value.message, info.value.fix))
    assert errors[0][0] == f"{tmp_path / 'config.json'}: {message}" or errors[0][0].startswith(
        f"{tmp_path / 'config.json'}: {message} ("
    )
    assert errors[1] == errors[0] and errors[2] == errors[0]


def test_a_missing_model_is_the_same_one_line_for_every_command(tmp_path):
    """The commands check MODEL / SOURCE before importing the model library, with the library's own message."""
    from typer.testing import CliRunner

    from zebra.cli.main import app
    from zebra.generation.loading import resolve_model_dir

    def cli_runner(*args):
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})

    missing = tmp_path / "nope"
    with pytest.raises(ZebraError) as info:
        resolve_model_dir(missing)
    for args in (
        ["eval", str(missing)],
        ["chat", str(missing)],
        ["generate", str(missing), "--prompt", "hi"],
    ):
        result = cli_runner(*args)
        assert result.exit_code == 1
        assert f"MODEL {missing}: no such file or directory" in result.stderr
        assert info.value.fix in " ".join(result.stderr.split())
    for args, what in (
        (["convert", str(missing)], ""),
        (["verify", str(tmp_path), "--against", str(missing)], "--against "),
    ):
        result = cli_runner(*args)
        assert result.exit_code == 1 and f"{what}{missing}: no such file or directory" in result.stderr


def test_a_corrupt_weights_file_is_one_line_for_the_loading_commands(tmp_path):
    """An export whose model.safetensors is not one (safetensors raises its own SafetensorError): generate and
    bench decode name the folder and the reason instead of reporting a bug."""
    from typer.testing import CliRunner

    from zebra.cli.main import app

    (tmp_path / "config.json").write_text('{"model_type": "zebra"}')
    (tmp_path / "model.safetensors").write_bytes(b"junk")
    for args in (
        ["generate", str(tmp_path), "--prompt", "hi", "--tokenizer", "byte", "--device", "cpu"],
        ["bench", "decode", str(tmp_path), "--device", "cpu"],
    ):
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 1, result.output
        assert f"MODEL {tmp_path}: cannot load (" in result.stderr and "bug" not in result.stderr


def test_a_run_without_a_checkpoint_yet_is_told_as_such(tmp_path):
    """A run folder (config.yaml) that has saved no checkpoint: chat and convert say so, instead of calling it
    no training run (with a hint naming convert's --from)."""
    from typer.testing import CliRunner

    from zebra.cli.main import app

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("extends: tiny\n")
    for args in (["chat", str(run), "--yes"], ["convert", str(run)]):
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 1, result.output
        assert (
            f"{run}: a training run with no checkpoint yet" in result.stderr and "--from" not in result.stderr
        )


def test_check_output_lets_force_replace_only_an_empty_or_model_folder(tmp_path):
    check_output(tmp_path / "new", force=False)  # nothing there yet
    (tmp_path / "empty").mkdir()
    with pytest.raises(ZebraError, match="already exists"):
        check_output(tmp_path / "empty", force=False)
    check_output(tmp_path / "empty", force=True)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    check_output(tmp_path / "model", force=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard.bin").write_bytes(b"x")
    with pytest.raises(ZebraError, match="holds files but no config"):
        check_output(tmp_path / "data", force=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ZebraError, match="not a directory"):
        check_output(tmp_path / "file", force=True)
