"""HF export: the flat trust_remote_code files load and run in a process where zebra cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tests.models.tiny import tiny_model

from zebra.models.remote_code import REQUIRED_PACKAGES, write_remote_code

LOADER = textwrap.dedent(
    """
    import importlib.abc, json, sys
    source = {sys.argv[2] + d for d in ("", "/src", "/kernels")}   # the checkout, not a .venv inside it
    sys.path[:] = [p for p in sys.path if p.rstrip("/") not in source]   # no zebra source on the path

    class BlockZebra(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("zebra", "zebra_kernels"):
                raise ImportError("blocked: " + name)

    sys.meta_path.insert(0, BlockZebra())
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.tensor(json.loads(sys.argv[3]))
    for export, out in json.loads(sys.argv[1]).items():  # every export in this one process
        model = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)
        model = model.double().eval()  # A_log / D are created in float32 (FLA, Megatron) whatever `dtype` asks
        with torch.no_grad():
            logits = model(ids).logits
        generated = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        torch.save({"logits": logits, "generated": generated, "module": type(model).__module__}, out)
    """
)
IDS = [[5, 17, 99, 3, 250, 42, 7], [1, 2, 3, 4, 5, 6, 7]]
LATENT_NORMS = {"latent-norms": True, "no-latent-norms": False}


@pytest.fixture(scope="module")
def loaded_without_zebra(tmp_path_factory) -> dict[str, tuple]:
    """{id: (model, export, what the export gave in a process where zebra cannot be imported)}: one tiny model
    with MLA latent norms and one without, exported, then loaded by one such process (one start-up for both)."""
    tmp_path = tmp_path_factory.mktemp("remote-code")
    models, exports = {}, {}
    for name, latent_norm in LATENT_NORMS.items():
        model = tiny_model("tiny", mla_latent_norm=latent_norm)
        export = tmp_path / f"export-{name}"
        model.config.auto_map = write_remote_code(export)
        model.save_pretrained(export)
        models[name], exports[name] = model, export
    outs = {name: tmp_path / f"{name}.pt" for name in LATENT_NORMS}
    src_root = os.path.dirname(os.path.dirname(os.path.dirname(__import__("zebra").__file__)))  # /.../main
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    to_load = json.dumps({str(exports[name]): str(outs[name]) for name in LATENT_NORMS})
    subprocess.run(
        [sys.executable, "-c", LOADER, to_load, src_root, json.dumps(IDS)], check=True, env=env, cwd=tmp_path
    )
    return {name: (models[name], exports[name], torch.load(outs[name])) for name in LATENT_NORMS}


@pytest.mark.parametrize("name", LATENT_NORMS)
def test_export_loads_without_zebra_and_gives_the_same_logits(loaded_without_zebra, name):
    model, export, result = loaded_without_zebra[name]
    assert json.loads((export / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"] == (
        "modeling_zebra.ZebraForCausalLM"
    )
    assert result["module"].startswith("transformers_modules.")  # the exported code, not zebra's
    assert json.loads((export / "config.json").read_text())["mla_latent_norm"] is LATENT_NORMS[name]
    ids_t = torch.tensor(IDS)
    with torch.no_grad():
        torch.testing.assert_close(result["logits"], model(ids_t).logits, atol=1e-12, rtol=0)
    expected = model.generate(ids_t, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(result["generated"], expected)


def test_exported_files_import_only_torch_transformers_and_the_standard_library(tmp_path):
    """transformers refuses remote code importing an uninstalled package outside `try` (checked per file for hub
    repos); optional FLA imports must be guarded."""
    from transformers.dynamic_module_utils import get_imports, get_relative_imports

    write_remote_code(tmp_path)
    files = {p.stem: p for p in tmp_path.glob("*.py")}
    assert {"configuration_zebra", "modeling_zebra", "cache_zebra", "layers_mla", "zebra_kernels"} <= set(
        files
    )
    for stem, path in files.items():
        outside = {m for m in get_imports(path) if m not in sys.stdlib_module_names} - REQUIRED_PACKAGES
        assert outside == set(), stem
        assert set(get_relative_imports(path)) <= set(files), stem  # every relative import is a file here
    assert (
        "try:" in files["zebra_kernels_delta_rule_fla_backend"].read_text()
    )  # the FLA backend import is guarded


def test_exported_code_files_follow_the_umask_so_other_users_can_load_them(tmp_path):
    """mkstemp made every .py 0600: another user's trust_remote_code import failed with a permission error."""
    old = os.umask(0o022)
    try:
        write_remote_code(tmp_path)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.glob("*.py")}
    assert modes and set(modes.values()) == {0o644}, modes
