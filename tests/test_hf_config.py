"""A folder's config.json is read one way: format detection (convert, verify) and model loading (eval, chat,
generate, bench decode) name a broken one alike."""

from __future__ import annotations

import pytest

from zebra.errors import ZebraError
from zebra.hf_config import config_model_type


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
