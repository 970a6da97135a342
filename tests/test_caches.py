"""zebra's cache folders: the root and the kernel cache, and the variables that point Triton and inductor there
(a value the user set wins)."""

from __future__ import annotations

from pathlib import Path

from zebra.core.caches import kernel_cache_dir, use_kernel_cache, zebra_cache_dir


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

    from zebra.core.caches import inductor_default_dir, set_by_torch

    assert inductor_default_dir() == default_cache_dir()  # computed as torch does
    env = {"ZEBRA_KERNEL_CACHE": "/fast/k", "TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    assert use_kernel_cache(env)["TORCHINDUCTOR_CACHE_DIR"] == "/fast/k/inductor"
    assert set_by_torch("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert not set_by_torch("TORCHINDUCTOR_CACHE_DIR", "/mine") and not set_by_torch(
        "HF_HOME", default_cache_dir()
    )


def torchs_own_values(monkeypatch, inductor: str | None = None) -> dict[str, str]:
    """What torch writes into os.environ itself, computed by torch's own functions (inductor's folder `inductor`,
    default: its own): its folder, the Triton cache its first kernel on GPU 0 takes, its ptxas, and so on."""
    from torch._inductor.runtime import cache_dir_utils, compile_tasks

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    if inductor:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", inductor)
    else:
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    triton = cache_dir_utils.triton_cache_dir(
        0
    )  # (writes the inductor folder into os.environ, as torch does)
    return {
        "TORCHINDUCTOR_CACHE_DIR": cache_dir_utils.cache_dir(),
        "TRITON_CACHE_DIR": triton,
        "TORCH_WARM_POOL": "0",
        "TRITON_PTXAS_PATH": str(Path(compile_tasks.__file__).absolute().parents[1] / "bin" / "ptxas"),
        "TRITON_LIBDEVICE_PATH": "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc",
        "TRITON_F32_DEFAULT": "ieee",
    }


def test_every_value_torch_writes_itself_counts_as_unset_unless_the_process_started_with_it(
    monkeypatch, tmp_path
):
    from zebra.core.caches import TORCH_WRITES, torch_writes

    theirs = torchs_own_values(monkeypatch)
    assert sorted(theirs) == sorted(TORCH_WRITES)
    assert torch_writes(theirs, started={}) == list(TORCH_WRITES)  # all written after the process started
    # Exported in the shell: the flags and paths are the user's; the two folders are torch's whoever set them
    # (a child of a process that used torch inherits them; nobody names them by hand).
    assert torch_writes(theirs, started=theirs) == ["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"]
    # Under a folder the user chose, inductor's Triton cache is still its own; the user's own choices are not.
    mine = torchs_own_values(monkeypatch, str(tmp_path / "mine"))
    assert mine["TRITON_CACHE_DIR"] == str(tmp_path / "mine" / "triton" / "0")
    assert torch_writes(mine, started={}) == [
        name for name in TORCH_WRITES if name != "TORCHINDUCTOR_CACHE_DIR"
    ]
    yours = {
        "TORCHINDUCTOR_CACHE_DIR": "/mine",
        "TRITON_CACHE_DIR": "/mine/triton",
        "TORCH_WARM_POOL": "1",
        "TRITON_PTXAS_PATH": "/opt/cuda/bin/ptxas",
        "TRITON_LIBDEVICE_PATH": "/opt/libdevice.bc",
        "TRITON_F32_DEFAULT": "tf32",
    }
    assert torch_writes(yours, started={}) == []


def test_zebras_cache_replaces_both_of_torchs_folders(monkeypatch):
    """TRITON_CACHE_DIR's default lies under inductor's folder: both are told before either is replaced."""
    theirs = torchs_own_values(monkeypatch)
    env = {"ZEBRA_KERNEL_CACHE": "/fast/k", **theirs}
    used = use_kernel_cache(env)
    assert (
        used["TRITON_CACHE_DIR"] == "/fast/k/triton" and used["TORCHINDUCTOR_CACHE_DIR"] == "/fast/k/inductor"
    )


def test_child_processes_start_without_torchs_writes_and_with_yours(monkeypatch):
    from zebra.core.caches import without_torch_writes

    theirs = torchs_own_values(monkeypatch)
    env = {**theirs, "NCCL_DEBUG": "INFO"}
    with without_torch_writes(env) as removed:  # this process started with none of torch's values
        assert sorted(removed) == sorted(theirs) and env == {"NCCL_DEBUG": "INFO"}
        env["TORCH_WARM_POOL"] = "1"  # written meanwhile: stays
    assert env == {**theirs, "NCCL_DEBUG": "INFO", "TORCH_WARM_POOL": "1"}


# Where the packages zebra's launcher and ranks import write into os.environ (their test runners aside).
SOURCES = {"torch": "_inductor", "triton": "", "fla": ""}
TEST_MODULES = ("_test", "_compile_warmup", "_internal_testing")


def test_the_table_knows_every_variable_torch_triton_and_fla_write_for_the_ranks():
    """Read from their sources: a write of a variable a launcher could hand the ranks (allow-listed, or one of
    the cache variables) that TORCH_WRITES lacks fails here, naming it and the file (a torch upgrade that adds
    one: add it to the table with how its value is told)."""
    import importlib.util
    import re

    from zebra.core.caches import TORCH_WRITES, cache_settings
    from zebra.launch.environment import allowed

    write = re.compile(r"""os\.environ\[\s*["']([A-Za-z0-9_]+)["']\s*\]\s*=(?!=)""")
    found: dict[str, str] = {}
    for package, under in SOURCES.items():
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin, package
        root = Path(spec.origin).parent
        for path in sorted((root / under).rglob("*.py")):
            if path.name.startswith(TEST_MODULES):
                continue
            for name in write.findall(path.read_text(errors="replace")):
                if allowed(name) or name in cache_settings({}):
                    found.setdefault(name, str(path.relative_to(root.parent)))
    assert {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_WARM_POOL"} <= set(found)  # the scan reads
    assert {k: v for k, v in found.items() if k not in TORCH_WRITES} == {}


def test_bytecode_goes_to_zebras_cache_only_where_python_was_told_to_write_none():
    from types import SimpleNamespace

    from zebra.core.caches import use_bytecode_cache

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
