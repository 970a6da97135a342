"""One reading of --device and --dtype for every command that loads weights."""

from __future__ import annotations

import pytest
import torch

from zebra.core.device import resolve_device, resolve_dtype
from zebra.core.errors import ZebraError


def test_default_device_is_cuda_only_when_there_is_one():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None) == resolve_device("auto") == expected
    assert resolve_device("cpu") == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_one_line_error():
    with pytest.raises(ZebraError, match="--device cuda:1: no CUDA device") as e:
        resolve_device("cuda:1")
    assert e.value.fix == "pass --device cpu"


def test_dtype_names():
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("fp16", "cuda") is torch.float16
    assert resolve_dtype("fp32") is torch.float32
    assert resolve_dtype("fp64") is torch.float64
    with pytest.raises(ZebraError, match="--dtype int8: unknown"):
        resolve_dtype("int8")


def test_auto_keeps_the_checkpoint_dtype_unless_a_gpu_default_is_asked_for():
    assert resolve_dtype("auto") is None
    assert resolve_dtype("auto", "cuda") is None  # eval and convert: the checkpoint's everywhere
    assert resolve_dtype("auto", "cuda:0", auto_on_gpu="bf16") is torch.bfloat16  # chat and generate
    assert resolve_dtype("auto", "cpu", auto_on_gpu="bf16") is None
    assert resolve_dtype("fp32", "cuda", auto_on_gpu="bf16") is torch.float32  # an explicit name wins
