"""Python, torch and package checks against this machine's real installation, plus their other branches."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from zebra.doctor.gpu import gather_gpus
from zebra.doctor.packages import (
    PACKAGES,
    check_package,
    check_packages,
    check_python,
    check_torch,
    declared_spec,
    in_spec,
    installed,
    transformers_spec,
)

PKG = {p.name: p for p in PACKAGES}
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_python_ok_on_this_interpreter():
    check = check_python()
    assert check.status == "ok"
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in check.detail


def test_python_too_old_fails_with_fix():
    check = check_python((3, 10, 14))
    assert check.status == "fail"
    assert "3.10.14 is older than 3.11" in check.detail
    assert "3.11" in check.fix


def test_torch_reports_the_real_build():
    import torch

    inv = gather_gpus()
    check = check_torch(inv.torch_version, declared_spec("torch"), inv.backend, inv.runtime, False)
    assert check.status == "ok"
    assert torch.__version__ in check.detail
    expected = "ROCm build" if torch.version.hip else "CUDA" if torch.version.cuda else "CPU build"
    assert expected in check.detail


def test_torch_missing_or_out_of_range_fails():
    missing = check_torch(None, ">=2.6,<2.15", "cpu", None, False)
    assert missing.status == "fail" and missing.fix == "pip install torch==2.13.0"
    old = check_torch("2.5.1", "<2.15,>=2.6", "cuda", "12.4", False)
    assert old.status == "fail"
    assert "2.5.1 is outside the supported range >=2.6,<2.15" in old.detail
    assert old.fix == "pip install 'torch>=2.6,<2.15'"


def test_torch_cpu_build_on_gpu_machine_warns():
    check = check_torch("2.13.0+cpu", None, "cpu", None, gpu_device_nodes=True)
    assert check.status == "warn"
    assert "CUDA or ROCm build" in check.fix


def test_torch_rocm_build_is_named():
    check = check_torch("2.9.0+rocm7.0", None, "rocm", "7.0.51831", False)
    assert check.status == "ok" and "ROCm build (HIP 7.0.51831)" in check.detail


def test_declared_torch_range_matches_pyproject():
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    torch_req = next(Requirement(d) for d in deps if Requirement(d).name == "torch")
    assert SpecifierSet(declared_spec("torch")) == torch_req.specifier


def test_transformers_range_is_zebras_narrowed_by_fla_metadata():
    if installed(["flash-linear-attention"]) is None:
        pytest.skip("FLA is not installed")
    spec, source = transformers_spec()
    assert SpecifierSet(spec) == SpecifierSet(
        declared_spec("transformers", by="flash-linear-attention")
    ) & SpecifierSet(declared_spec("transformers"))
    assert "5.16.0" not in SpecifierSet(spec) and "5.25.0" in SpecifierSet(
        spec
    )  # KimiLinear: 5.17.0 and later
    assert source.startswith("FLA ")


def test_transformers_outside_fla_range_fails():
    check = check_package(PKG["transformers"], ("transformers", "4.57.1"), "<6,>=5.6.2")
    assert check.status == "fail"
    assert check.fix == "pip install 'transformers>=5.6.2,<6'"
    inside = check_package(PKG["transformers"], ("transformers", "5.24.0"), "<6,>=5.6.2")
    assert inside.status == "ok"


def test_absent_optional_package_warns_with_pip_command():
    check = check_package(PKG["mamba-ssm"], None, None)
    assert check.status == "warn"
    # the install that needs no nvcc: no CUDA extension built, none downloaded, torch (and `wheel`, which its
    # setup.py imports) from this environment
    assert check.fix.startswith(
        "pip install wheel && MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-build-isolation "
        "'zebra-llama[mamba]'"
    )


def test_torchao_absent_warns_with_the_fp8_extra_and_outside_its_range_fails():
    """torchao is train.fp8's: missing, a warning with the extra that installs the tested range."""
    missing = check_package(PKG["torchao"], None, ">=0.17,<0.19")
    assert missing.status == "warn" and missing.fix == "pip install 'zebra-llama[fp8]'"
    assert "train.fp8" in missing.detail
    assert check_package(PKG["torchao"], ("torchao", "0.16.0"), "<0.19,>=0.17").status == "fail"
    assert check_package(PKG["torchao"], ("torchao", "0.17.0"), "<0.19,>=0.17").status == "ok"


def test_absent_required_package_fails():
    check = check_package(PKG["megatron-core"], None, "<0.20,>=0.16.1")
    assert check.status == "fail"
    assert check.fix == "pip install 'megatron-core>=0.16.1,<0.20'"


def test_triton_under_another_distribution_name_is_labelled():
    check = check_package(PKG["triton"], ("pytorch-triton-rocm", "3.5.0"), None)
    assert check.status == "ok" and check.detail == "triton (pytorch-triton-rocm) 3.5.0"


def test_in_spec_accepts_local_tags_and_rejects_garbage():
    assert in_spec("2.13.0+cpu", ">=2.6,<2.15")
    assert not in_spec("2.15.0", ">=2.6,<2.15")
    assert not in_spec("not-a-version", ">=1")


def test_check_packages_covers_every_package_with_real_versions():
    checks = check_packages()
    assert [c.name for c in checks] == [p.name for p in PACKAGES]
    for check, pkg in zip(checks, PACKAGES, strict=True):
        found = installed(pkg.dists)
        if found is None:
            assert check.status == ("fail" if pkg.required else "warn") and check.fix
        else:
            assert found[1] in check.detail
