"""zebra's cache folders: the root and the kernel cache, and the variables that point Triton and inductor there
(a value the user set wins)."""

from __future__ import annotations

from pathlib import Path

from zebra.caches import kernel_cache_dir, use_kernel_cache, zebra_cache_dir


def test_kernel_cache_folder_follows_the_variables():
    assert zebra_cache_dir({}) == Path.home() / ".cache" / "zebra"
    assert kernel_cache_dir({}) == Path.home() / ".cache" / "zebra" / "kernels"
    assert kernel_cache_dir({"ZEBRA_CACHE": "/data/zc"}) == Path("/data/zc/kernels")
    assert kernel_cache_dir({"ZEBRA_CACHE": "/data/zc", "ZEBRA_KERNEL_CACHE": "/fast/k"}) == Path("/fast/k")


def test_use_kernel_cache_sets_only_what_is_unset():
    env = {"ZEBRA_KERNEL_CACHE": "/fast/k", "TORCHINDUCTOR_CACHE_DIR": "/mine"}
    used = use_kernel_cache(env)
    assert env["TRITON_CACHE_DIR"] == "/fast/k/triton" and env["TRITON_CACHE_AUTOTUNING"] == "1"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/mine"  # the user's value stays
    assert used == {
        "TRITON_CACHE_DIR": "/fast/k/triton",
        "TRITON_CACHE_AUTOTUNING": "1",
        "TORCHINDUCTOR_CACHE_DIR": "/mine",
    }


def test_inductors_own_default_counts_as_unset():
    """Inductor writes its default folder into os.environ on first use (`import megatron.core` does): that is
    no choice of the user's, so zebra's cache replaces it."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from zebra.caches import inductor_default_dir, set_by_torch

    assert inductor_default_dir() == default_cache_dir()  # computed as torch does
    env = {"ZEBRA_KERNEL_CACHE": "/fast/k", "TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    assert use_kernel_cache(env)["TORCHINDUCTOR_CACHE_DIR"] == "/fast/k/inductor"
    assert set_by_torch("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert not set_by_torch("TORCHINDUCTOR_CACHE_DIR", "/mine") and not set_by_torch(
        "HF_HOME", default_cache_dir()
    )


def test_bytecode_goes_to_zebras_cache_only_where_python_was_told_to_write_none():
    from types import SimpleNamespace

    from zebra.caches import use_bytecode_cache

    env = {"ZEBRA_CACHE": "/data/zc"}
    told_not_to = SimpleNamespace(dont_write_bytecode=True, pycache_prefix=None)
    assert use_bytecode_cache(told_not_to, env, shipped=False) == Path("/data/zc/pycache")
    assert told_not_to.pycache_prefix == "/data/zc/pycache" and told_not_to.dont_write_bytecode is False
    moved = SimpleNamespace(dont_write_bytecode=True, pycache_prefix=None)
    assert use_bytecode_cache(moved, {**env, "ZEBRA_PYCACHE": "/fast/pyc"}, shipped=False) == Path(
        "/fast/pyc"
    )
    assert moved.pycache_prefix == "/fast/pyc"
    for state, env, shipped in (
        (
            SimpleNamespace(dont_write_bytecode=False, pycache_prefix=None),
            {},
            False,
        ),  # Python writes __pycache__
        (SimpleNamespace(dont_write_bytecode=True, pycache_prefix="/mine"), {}, False),  # your prefix wins
        (
            SimpleNamespace(dont_write_bytecode=True, pycache_prefix=None),
            {"ZEBRA_PYCACHE": "0"},
            False,
        ),  # off
        (
            SimpleNamespace(dont_write_bytecode=True, pycache_prefix=None),
            {},
            True,
        ),  # the packages ship theirs
    ):
        before = vars(state).copy()
        assert use_bytecode_cache(state, env, shipped=shipped) is None and vars(state) == before


def test_a_zebra_process_under_python_B_caches_bytecode_outside_the_source_tree(tmp_path):
    import os
    import py_compile
    import subprocess
    import sys

    (tmp_path / "src" / "torch").mkdir(
        parents=True
    )  # a torch installed without its bytecode, as on the GPU machine
    (tmp_path / "src" / "torch" / "__init__.py").write_text("")
    (tmp_path / "src" / "probe.py").write_text("VALUE = 1\n")
    env = {k: v for k, v in os.environ.items() if k != "ZEBRA_PYCACHE"}  # tests/conftest.py pins it
    env["PYTHONPATH"] = f"{tmp_path / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    code = "import zebra.cli, probe; print(probe.__cached__)"

    def run(**extra) -> str:
        result = subprocess.run(
            [sys.executable, "-B", "-c", code], env={**env, **extra}, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip()

    cached = Path(run(ZEBRA_CACHE=str(tmp_path / "zc")))
    assert cached.is_file() and cached.is_relative_to(tmp_path / "zc" / "pycache")
    assert not (tmp_path / "src" / "__pycache__").exists()
    cached = Path(run(ZEBRA_CACHE=str(tmp_path / "zc"), ZEBRA_PYCACHE=str(tmp_path / "own")))
    assert cached.is_file() and cached.is_relative_to(tmp_path / "own")
    run(ZEBRA_CACHE=str(tmp_path / "off"), ZEBRA_PYCACHE="0")  # Python's -B stands: nothing written anywhere
    assert not (tmp_path / "off").exists() and not (tmp_path / "src" / "__pycache__").exists()
    py_compile.compile(str(tmp_path / "src" / "torch" / "__init__.py"))  # now torch ships its bytecode
    run(ZEBRA_CACHE=str(tmp_path / "shipped"))  # Python reads the shipped bytecode; no cache of ours
    assert not (tmp_path / "shipped").exists()
