"""NCCL/RCCL advice: a pure function of the environment and the GPUs."""

from __future__ import annotations

from zebra.doctor.collectives import check_collective_env, recommended
from zebra.doctor.gpu import GpuDevice, GpuInventory, gather_gpus

H200 = GpuDevice("NVIDIA H200", 150_000_000_000, "sm_90")
A100 = GpuDevice("NVIDIA A100", 80_000_000_000, "sm_80")
MI300X = GpuDevice("AMD Instinct MI300X", 206_000_000_000, "gfx942")


def cuda(*devices):
    return GpuInventory("cuda", "2.11.0", "13.0", "580", devices)


def test_without_gpu_nothing_is_checked():
    inv = gather_gpus()
    if inv.devices:
        return  # the branch below covers machines with GPUs
    check = check_collective_env({}, inv)
    assert check.status == "warn" and "no GPU" in check.detail


def test_single_hopper_needs_only_the_watchdog_timeout():
    check = check_collective_env({}, cuda(H200))
    assert check.status == "warn"
    assert check.fix == "export TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=1800"


def test_multi_gpu_hopper_asks_for_nvls_off():
    check = check_collective_env({}, cuda(H200, H200))
    assert "NCCL_NVLS_ENABLE=0" in check.fix and "TORCH_SYMM_MEM_DISABLE_MULTICAST=1" in check.fix
    ampere = check_collective_env({}, cuda(A100, A100))
    assert "NCCL_NVLS_ENABLE" not in ampere.fix


def test_rocm_gets_the_primus_settings():
    inv = GpuInventory("rocm", "2.9.0", "7.0", None, (MI300X,) * 8)
    check = check_collective_env({}, inv)
    for setting in (
        "HSA_NO_SCRATCH_RECLAIM=1",
        "RCCL_MSCCL_ENABLE=0",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=1800",
    ):
        assert setting in check.fix
    assert "NVLS" not in check.fix


def test_all_set_is_ok_and_explicit_values_are_respected():
    inv = cuda(H200, H200)
    env = {s.var: s.value for s in recommended(inv)}
    env["NCCL_NVLS_ENABLE"] = "1"  # a deliberate choice is not second-guessed
    check = check_collective_env(env, inv)
    assert check.status == "ok"
    assert "NCCL_NVLS_ENABLE=1" in check.detail


def test_debug_logging_is_flagged():
    inv = cuda(H200)
    env = {s.var: s.value for s in recommended(inv)} | {"NCCL_DEBUG": "INFO"}
    check = check_collective_env(env, inv)
    assert check.status == "warn"
    assert "NCCL_DEBUG=INFO" in check.detail and "unset NCCL_DEBUG" in check.fix
