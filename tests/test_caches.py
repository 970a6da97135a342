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
