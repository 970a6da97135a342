"""HF token (never printed) and free-disk checks."""

from __future__ import annotations

from pathlib import Path

from zebra.doctor.host import check_disk, check_hf_token

SECRET = "hf_zebraTestTokenThatMustNeverBePrinted"


def test_token_in_environment_is_ok_and_never_shown(tmp_path):
    check = check_hf_token({"HF_TOKEN": SECRET, "HF_HOME": str(tmp_path)})
    assert check.status == "ok"
    assert "HF_TOKEN is set" in check.detail and "no cached login token" in check.detail
    assert SECRET not in repr(check)


def test_no_token_anywhere_warns(tmp_path):
    check = check_hf_token({"HF_HOME": str(tmp_path)})
    assert check.status == "warn"
    assert "meta-llama" in check.detail
    assert "HF_TOKEN" in check.fix and "hf auth login" in check.fix


def test_cached_login_token_counts_and_is_not_shown(tmp_path):
    (tmp_path / "token").write_text(SECRET + "\n")
    check = check_hf_token({"HF_HOME": str(tmp_path)})
    assert check.status == "ok"
    assert str(tmp_path / "token") in check.detail
    assert SECRET not in repr(check)


def test_token_path_override_and_empty_file(tmp_path):
    token = tmp_path / "elsewhere"
    token.write_text("   \n")
    assert check_hf_token({"HF_TOKEN_PATH": str(token)}).status == "warn"  # an empty file is no token
    token.write_text(SECRET)
    assert check_hf_token({"HF_TOKEN_PATH": str(token)}).status == "ok"


def test_disk_with_tiny_and_huge_needs(tmp_path):
    small = check_disk(tmp_path, 1, "--sample test")
    assert small.status == "ok" and str(tmp_path) in small.detail
    huge = check_disk(tmp_path, 10**18, "--sample 10BT")
    assert huge.status == "warn"
    assert "--sample 10BT needs about 1,000,000,000 GB" in huge.detail
    assert "--data-dir" in huge.fix


def test_disk_measures_the_nearest_existing_parent(tmp_path):
    check = check_disk(tmp_path / "not" / "yet", 1, "x")
    assert check.status == "ok" and f"free at {tmp_path} " in check.detail


def test_kernel_cache_says_where_compiled_kernels_persist(tmp_path, monkeypatch):
    from zebra.doctor.host import check_kernel_cache

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    triton = tmp_path / "kc" / "triton" / "abc"
    triton.mkdir(parents=True)
    (triton / "kernel.cubin").write_bytes(b"x" * 2000)
    (triton / "kernel.autotune.json").write_text("{}")
    check = check_kernel_cache({"ZEBRA_KERNEL_CACHE": str(tmp_path / "kc")})
    assert check.status == "ok" and f"{tmp_path / 'kc' / 'triton'} (2 files" in check.detail
    assert str(tmp_path / "kc" / "inductor") in check.detail


def test_kernel_cache_warns_about_a_cache_a_reboot_empties_or_autotuning_left_off(tmp_path, monkeypatch):
    from zebra.doctor.host import check_kernel_cache

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    check = check_kernel_cache({"TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), "HOME": str(tmp_path)})
    assert check.status == "warn" and "emptied by a reboot" in check.detail
    assert "TRITON_CACHE_DIR set by you" in check.detail and "ZEBRA_KERNEL_CACHE" in check.fix
    elsewhere = tmp_path / "home" / "cache"
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    check = check_kernel_cache({"ZEBRA_KERNEL_CACHE": str(elsewhere), "TRITON_CACHE_AUTOTUNING": "0"})
    assert check.status == "warn" and "TRITON_CACHE_AUTOTUNING=0" in check.detail


def test_kernel_cache_in_a_file_is_a_warning_not_ok(tmp_path):
    """ZEBRA_KERNEL_CACHE under a file: every command refuses it, so doctor may not call it ok (it did: the file
    itself is writable)."""
    from zebra.doctor.host import check_kernel_cache

    (tmp_path / "cache").write_text("a file")
    check = check_kernel_cache({"ZEBRA_KERNEL_CACHE": str(tmp_path / "cache")})
    assert check.status == "warn" and f"a file is in the way: {tmp_path / 'cache'};" in check.detail


def test_kernel_cache_does_not_take_torchs_own_folders_for_yours(tmp_path, monkeypatch):
    """Once something here compiled, os.environ holds inductor's default folder (/tmp/torchinductor_USER) and, after
    a Triton kernel on a GPU, its Triton cache under it: torch chose those, and a zebra run replaces them."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from zebra.doctor.host import check_kernel_cache

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    theirs = {
        "TORCHINDUCTOR_CACHE_DIR": default_cache_dir(),
        "TRITON_CACHE_DIR": str(Path(default_cache_dir()) / "triton" / "0"),
    }
    check = check_kernel_cache({"ZEBRA_KERNEL_CACHE": str(tmp_path / "kc"), **theirs})
    assert check.status == "ok" and "set by you" not in check.detail, check.detail
    assert (
        f"{tmp_path / 'kc' / 'triton'} (0 files" in check.detail
        and str(tmp_path / "kc" / "inductor") in check.detail
    )
    mine = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")}
    check = check_kernel_cache({"ZEBRA_KERNEL_CACHE": str(tmp_path / "kc"), **mine})
    assert "TORCHINDUCTOR_CACHE_DIR set by you" in check.detail and str(tmp_path / "mine") in check.detail


def test_bytecode_check_says_where_compiled_modules_persist(tmp_path):
    from types import SimpleNamespace

    from zebra.doctor.host import check_bytecode

    assert check_bytecode(False).status == "ok"  # Python's own __pycache__
    cache = tmp_path / "zc" / "pycache"
    (cache / "x").mkdir(parents=True)
    (cache / "x" / "m.cpython-311.pyc").write_bytes(b"x" * 3000)
    zebras = SimpleNamespace(dont_write_bytecode=False, pycache_prefix=str(cache))
    check = check_bytecode(True, zebras, {"ZEBRA_CACHE": str(tmp_path / "zc")})
    assert check.status == "ok" and f"zebra's cache {cache} (1 files" in check.detail
    off = SimpleNamespace(dont_write_bytecode=True, pycache_prefix=None)
    assert "ship their compiled modules" in check_bytecode(True, off, {}, shipped=True).detail
    check = check_bytecode(True, off, {"ZEBRA_PYCACHE": "0"}, shipped=False)
    assert check.status == "warn" and "ZEBRA_PYCACHE=0" in check.detail and "unset ZEBRA_PYCACHE" in check.fix
