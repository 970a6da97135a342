"""GPU inventory checks: the real machine (no GPU here: a warning, never a crash) and every branch as data."""

from __future__ import annotations

import re

import pytest

from zebra.doctor.gpu import (
    GpuDevice,
    GpuInventory,
    check_fla_triton_hopper,
    check_gpus,
    compute_capability,
    gather_gpus,
)

H200 = GpuDevice("NVIDIA H200", 150_000_000_000, "sm_90")
MI300X = GpuDevice("AMD Instinct MI300X", 206_000_000_000, "gfx942")


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def test_no_gpu_here_is_a_warning():
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    inv = gather_gpus()
    check = check_gpus(inv)
    assert check.status == "warn"
    assert check.detail.startswith("no GPU")
    assert inv.devices == ()


@pytest.mark.gpu
def test_real_gpus_are_described():
    inv = gather_gpus()
    check = check_gpus(inv)
    assert inv.devices and check.status in ("ok", "warn")
    assert all(re.fullmatch(r"sm_\d+|gfx[0-9a-f]+", d.arch) for d in inv.devices)
    for device in inv.devices:
        assert device.name in check.detail and device.arch in check.detail


def test_cuda_devices_are_grouped_with_driver():
    inv = GpuInventory("cuda", "2.11.0", "13.0", "580.159.04", (H200, H200))
    check = check_gpus(inv)
    assert check.status == "ok"
    assert "2 x NVIDIA H200 (139.7 GiB, sm_90)" in check.detail
    assert "CUDA 13.0, driver 580.159.04" in check.detail


def test_rocm_7_is_ok_and_older_rocm_warns():
    new = check_gpus(GpuInventory("rocm", "2.9.0", "7.0.51831", "7.0.0", (MI300X,) * 8))
    assert new.status == "ok" and "8 x AMD Instinct MI300X" in new.detail and "gfx942" in new.detail
    old = check_gpus(GpuInventory("rocm", "2.6.0", "6.4.43482", None, (MI300X,)))
    assert old.status == "warn"
    assert "ROCm 6.4 is older than 7.0" in old.detail
    assert "7.0" in old.fix


def test_gpu_build_without_visible_device_warns_with_reason():
    check = check_gpus(GpuInventory("cuda", "2.11.0", "13.0", None, (), "torch.cuda.is_available() is False"))
    assert check.status == "warn"
    assert "is_available() is False" in check.detail
    assert "nvidia-smi" in check.fix and "CUDA_VISIBLE_DEVICES" in check.fix


def test_pre_ampere_gpu_warns_about_bf16():
    check = check_gpus(GpuInventory("cuda", "2.11.0", "12.4", None, (GpuDevice("Tesla T4", 16e9, "sm_75"),)))
    assert check.status == "warn" and "bf16" in check.detail
    assert "train.precision=fp32" in check.fix


def test_missing_torch_warns():
    check = check_gpus(GpuInventory("none"))
    assert check.status == "warn" and "pip install torch" in check.fix


@pytest.mark.parametrize(
    ("arch", "cc"),
    [("sm_90", (9, 0)), ("sm_90a", (9, 0)), ("sm_120", (12, 0)), ("sm_86", (8, 6)), ("gfx942", (0, 0))],
)
def test_compute_capability(arch, cc):
    assert compute_capability(arch) == cc


@pytest.mark.parametrize(
    ("triton", "status"),
    [
        ("3.3.1", "ok"),
        ("3.4.0", "fail"),
        ("3.6.0", "fail"),
        ("3.7.0", "fail"),
        ("3.7.1", "ok"),
        ("3.9.0", "ok"),
    ],
)
def test_fla_on_hopper_refuses_bad_triton(triton, status):
    check = check_fla_triton_hopper("0.6.0", triton, None, ("sm_90",))
    assert check.status == status
    if status == "fail":
        assert f"Triton {triton}" in check.detail and "sm_90" in check.detail
        assert "pip install 'triton>=3.7.1'" in check.fix and "tilelang" in check.fix


def test_tilelang_rescues_the_bad_range():
    check = check_fla_triton_hopper("0.6.0", "3.6.0", "0.1.7", ("sm_90",) * 8)
    assert check.status == "ok" and "tilelang 0.1.7" in check.detail


@pytest.mark.parametrize(
    ("fla", "archs", "why"),
    [
        (None, ("sm_90",), "FLA is not installed"),
        ("0.6.0", ("gfx942",), "no Hopper"),
        ("0.6.0", (), "no GPU"),
    ],
)
def test_not_affected_without_fla_or_hopper(fla, archs, why):
    check = check_fla_triton_hopper(fla, "3.6.0", None, archs)
    assert check.status == "ok" and why in check.detail


def test_hopper_without_triton_warns():
    check = check_fla_triton_hopper("0.6.0", None, None, ("sm_90",))
    assert check.status == "warn" and "triton>=3.7.1" in check.fix


def test_real_machine_combination():
    from zebra.doctor.packages import installed

    inv = gather_gpus()
    fla, triton, tilelang = (installed([d]) for d in ("flash-linear-attention", "triton", "tilelang"))
    check = check_fla_triton_hopper(fla and fla[1], triton and triton[1], tilelang and tilelang[1], inv.archs)
    if fla is None or not any(a.startswith("sm_9") for a in inv.archs):
        assert check.status == "ok" and "not affected" in check.detail
        return
    from packaging.version import Version

    bad = triton is not None and Version("3.4") <= Version(triton[1]) < Version("3.7.1") and tilelang is None
    assert check.status == ("fail" if bad else "ok" if triton else "warn")
