"""Backend and mode choice: auto -> torch on CPU, a clear error for fla on CPU, the Hopper/Triton refusal."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

import pytest
import torch

import zebra_kernels
from zebra_kernels import backend as backend_module
from zebra_kernels import resolve_backend
from zebra_kernels._common import choose_mode
from zebra_kernels.testing import gdn_inputs, kda_inputs, ssd_inputs


@pytest.fixture
def fresh_backend_state():
    backend_module._logged.clear()
    backend_module.fla_backward_blocker.cache_clear()
    assert backend_module.fla_import_error() is None  # FLA's classes import on CPU (its kernels do not run)
    yield
    backend_module._logged.clear()
    backend_module.fla_backward_blocker.cache_clear()


def test_auto_on_cpu_is_torch_and_logs_once(caplog, fresh_backend_state):
    with caplog.at_level(logging.INFO, logger="zebra_kernels"):
        assert resolve_backend("auto", torch.device("cpu")) == "torch"
        assert resolve_backend("auto", "cpu") == "torch"
        assert resolve_backend("auto", None) == "torch"
    messages = [r.getMessage() for r in caplog.records if r.name == "zebra_kernels"]
    assert len(messages) == 1 and "'torch'" in messages[0] and "need a GPU" in messages[0]


def test_fla_on_cpu_and_unknown_backend_raise():
    with pytest.raises(ValueError, match="backend='fla' needs a CUDA/ROCm GPU"):
        resolve_backend("fla", "cpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("triton", "cpu")
    assert resolve_backend("torch", "cpu") == "torch"


def test_every_op_refuses_fla_on_cpu():
    q, k, v, g, beta, _ = gdn_inputs(1, 4, 1, 1, 4, 4)
    qk, kk, vk, gk, bk, _ = kda_inputs(1, 4, 1, 4, 4)
    x, dt, A, B, C, D, _ = ssd_inputs(1, 4, 2, 2, 1, 2)
    calls = [
        lambda: zebra_kernels.gated_delta_rule(q, k, v, g, beta, backend="fla"),
        lambda: zebra_kernels.kimi_delta_rule(qk, kk, vk, gk, bk, backend="fla"),
        lambda: zebra_kernels.mamba2_ssd(x, dt, A, B, C, D=D, backend="fla"),
        lambda: zebra_kernels.causal_conv1d(torch.randn(1, 4, 3), torch.randn(3, 4), backend="fla"),
        lambda: zebra_kernels.rms_norm_gated(torch.randn(4), torch.randn(4), None, eps=1e-6, backend="fla"),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="FLA kernels have no CPU path"):
            call()


@pytest.mark.parametrize(
    ("mode", "T", "grad", "expected"),
    [
        ("auto", 1, False, "recurrent"),
        ("auto", 64, False, "recurrent"),
        ("auto", 65, False, "chunk"),
        ("auto", 1, True, "chunk"),
        ("recurrent", 500, True, "recurrent"),
        ("chunk", 1, False, "chunk"),
    ],
    ids=lambda p: str(p),
)
def test_mode_choice(mode, T, grad, expected):
    assert choose_mode(mode, T, grad) == expected


def test_unknown_mode_raises():
    q, k, v, g, beta, _ = gdn_inputs(1, 4, 1, 1, 4, 4)
    with pytest.raises(ValueError, match="mode must be one of"):
        zebra_kernels.gated_delta_rule(q, k, v, g, beta, mode="fused")


def fake_gpu(monkeypatch, capability, triton_version, tilelang=False):
    """Pretend a CUDA device and a Triton version (the one thing this CPU machine cannot have)."""
    import importlib.util

    import triton

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(triton, "__version__", triton_version)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            object()
            if name == "tilelang" and tilelang
            else (None if name == "tilelang" else real_find_spec(name, *a))
        ),
    )


def test_hopper_with_bad_triton_falls_back_to_torch_with_a_warning(monkeypatch, caplog, fresh_backend_state):
    fake_gpu(monkeypatch, (9, 0), "3.5.1")
    reason = backend_module.fla_backward_blocker(0)
    assert reason is not None and "triton>=3.7.1" in reason and "3.5.1" in reason
    with caplog.at_level(logging.INFO, logger="zebra_kernels"):
        assert resolve_backend("auto", "cuda:0") == "torch"
    assert any(r.levelno == logging.WARNING and "triton>=3.7.1" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("capability", "triton_version", "tilelang"),
    [((9, 0), "3.7.1", False), ((9, 0), "3.3.1", False), ((8, 0), "3.5.0", False), ((9, 0), "3.5.0", True)],
    ids=["hopper-triton3.7.1", "hopper-triton3.3.1", "ampere-triton3.5", "hopper-triton3.5-tilelang"],
)
def test_healthy_gpu_setups_pick_fla(monkeypatch, fresh_backend_state, capability, triton_version, tilelang):
    fake_gpu(monkeypatch, capability, triton_version, tilelang)
    assert backend_module.fla_backward_blocker(0) is None
    assert resolve_backend("auto", "cuda") == "fla"


def test_mamba_ssm_backend_needs_a_gpu_for_every_op():
    x, dt, A, B, C, D, _ = ssd_inputs(1, 4, 2, 2, 1, 2)
    with pytest.raises(ValueError, match="backend='mamba_ssm' needs a CUDA/ROCm GPU"):
        zebra_kernels.mamba2_ssd(x, dt, A, B, C, D=D, backend="mamba_ssm")
    with pytest.raises(ValueError, match="backend='mamba_ssm' needs a CUDA/ROCm GPU"):
        zebra_kernels.causal_conv1d(torch.randn(1, 4, 3), torch.randn(3, 4), backend="mamba_ssm")
    assert backend_module.resolve_ssd_backend("auto", "cpu", "chunk") == "torch"


@pytest.mark.parametrize("auto_choice", ["fla", "mamba_ssm"])
def test_ssd_backend_choice_on_a_gpu_device(monkeypatch, fresh_backend_state, auto_choice):
    """A CUDA device object (no kernel runs): mamba-ssm serves the chunked scan only, and auto follows
    SSD_AUTO_CHUNK_BACKEND."""
    monkeypatch.setattr(backend_module, "SSD_AUTO_CHUNK_BACKEND", auto_choice)
    monkeypatch.setattr(backend_module, "mamba_ssm_import_error", lambda: None)
    cuda = torch.device("cuda", 0)
    resolve = backend_module.resolve_ssd_backend
    assert resolve("mamba_ssm", cuda, "chunk") == "mamba_ssm"
    assert resolve("mamba_ssm", cuda, "recurrent") == "fla"
    assert resolve("auto", cuda, "chunk") == auto_choice
    assert resolve("auto", cuda, "recurrent") == "fla"
    assert resolve("fla", cuda, "chunk") == "fla"
    assert resolve("torch", cuda, "chunk") == "torch"


def test_ssd_backend_without_mamba_ssm(monkeypatch, caplog, fresh_backend_state):
    """auto falls back to FLA's scan, logging once why (with the install command); an explicit mamba_ssm raises."""
    monkeypatch.setattr(backend_module, "SSD_AUTO_CHUNK_BACKEND", "mamba_ssm")
    monkeypatch.setattr(backend_module, "mamba_ssm_import_error", lambda: "mamba-ssm is missing; install it")
    cuda = torch.device("cuda", 0)
    with caplog.at_level(logging.INFO, logger="zebra_kernels"):
        assert backend_module.resolve_ssd_backend("auto", cuda, "chunk") == "fla"
    assert any("mamba-ssm is missing" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="backend='mamba_ssm' unavailable: mamba-ssm is missing"):
        backend_module.resolve_ssd_backend("mamba_ssm", cuda, "chunk")


@pytest.mark.skipif(importlib.util.find_spec("mamba_ssm") is None, reason="needs mamba-ssm installed")
def test_mamba_ssm_ssd_imports_without_its_cuda_extensions():
    """The SSD kernel module imports from a build without selective_scan_cuda (MAMBA_SKIP_CUDA_BUILD), and a
    plain `import mamba_ssm` afterwards behaves as before (the bare package is not left behind)."""
    module = backend_module.mamba_ssm_ssd_module()
    assert callable(module.mamba_chunk_scan_combined)
    assert backend_module.mamba_ssm_import_error() is None
    if importlib.util.find_spec("selective_scan_cuda") is None:
        assert "mamba_ssm" not in sys.modules
        with pytest.raises(ImportError, match="selective_scan_cuda"):
            importlib.import_module("mamba_ssm")


def test_triton_launches_move_to_the_tensors_gpu_only_when_it_is_not_current(monkeypatch):
    """Triton launches on the current CUDA device; our kernels make the tensor's device current around the launch
    (a model on cuda:1 with device 0 current), and change nothing otherwise (CPU, the current GPU, a CUDA graph
    capture on it)."""
    import contextlib
    from types import SimpleNamespace

    from zebra_kernels._common import on_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    other = on_device(SimpleNamespace(device=torch.device("cuda", 1)))
    assert isinstance(other, torch.cuda.device) and other.idx == 1
    for device in (torch.device("cuda", 0), torch.device("cpu")):
        assert isinstance(on_device(SimpleNamespace(device=device)), contextlib.nullcontext)


def test_compiled_norm_and_swiglu_leave_our_triton_kernels_to_inductor(monkeypatch):
    """Inside torch.compile the pre-norm and SwiGLU take the torch path even where the backend is FLA's (here
    pretended: the Triton kernels refuse to run), so inductor fuses them; eager calls still take the kernels."""
    import zebra_kernels.norm as norm_module
    import zebra_kernels.norm.triton_fused as triton_rms
    import zebra_kernels.swiglu.triton_fused as triton_swiglu
    from zebra_kernels import rms_norm, swiglu_linear
    from zebra_kernels.norm import torch_rms_norm

    def refuse(*args, **kwargs):
        raise AssertionError("a Triton kernel ran inside torch.compile")

    monkeypatch.setattr(backend_module, "resolve_backend", lambda backend, device: "fla")
    monkeypatch.setattr(triton_rms, "triton_rms_norm", refuse)
    monkeypatch.setattr(triton_swiglu, "triton_swiglu_linear", refuse)

    def sublayer(x, residual, weight, gate, up, down):  # [B, T, D] x2, [D], [B, T, F] x2, [D, F]
        h, stream = rms_norm(x, weight, eps=1e-6, residual=residual, prenorm=True)
        return h, stream, swiglu_linear(gate, up, down)

    torch.manual_seed(0)
    x, r, w = torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.rand(16) + 0.5
    g, u, d = torch.randn(2, 5, 32), torch.randn(2, 5, 32), torch.randn(16, 32)
    h, stream, out = torch.compile(sublayer, backend="aot_eager", fullgraph=True)(x, r, w, g, u, d)
    want_h, want_stream = torch_rms_norm(x, w, 1e-6, r, torch.float32)
    torch.testing.assert_close(h, want_h)
    torch.testing.assert_close(stream, want_stream)
    torch.testing.assert_close(out, torch.nn.functional.linear(torch.nn.functional.silu(g) * u, d))
    with pytest.raises(AssertionError, match="Triton kernel ran"):  # eager: the kernels' path
        norm_module.rms_norm(x, w, eps=1e-6, residual=r, prenorm=True)
