"""Which kernels a run uses: the trainer's first line names them, and a forced backend that cannot run is refused
before the run starts (a one-line error, not a crash inside the first step)."""

from __future__ import annotations

import pytest
import torch

import zebra_kernels.backend as backend_module
from zebra.core.errors import ZebraError
from zebra.recipes import load_recipe
from zebra.train.run import RankLayout, resolve_run
from zebra.train.trainer import kernels_in_use

CPU = RankLayout("cpu", nodes=1, ranks_per_node=1)


@pytest.mark.parametrize("backend", ["fla", "mamba_ssm"])
def test_a_gpu_kernel_backend_is_refused_on_the_cpu_before_the_run(tmp_path, backend):
    recipe = load_recipe("tiny", overrides=[f"model.kernel_backend={backend}"])
    with pytest.raises(ZebraError, match=rf"model\.kernel_backend={backend} needs a CUDA/ROCm GPU") as info:
        resolve_run(recipe, CPU, output=tmp_path)
    assert info.value.fix.startswith("--set model.kernel_backend=auto")
    assert not any(tmp_path.iterdir())
    with pytest.raises(
        ZebraError, match=rf"model\.kernel_backend={backend}: backend='{backend}' needs a CUDA"
    ):
        kernels_in_use(recipe.model.to_config(kernel_backend=backend), torch.device("cpu"))


def test_the_kernels_named_are_the_ones_resolved(monkeypatch):
    """On the CPU the torch reference; on a GPU (a device object: no kernel runs) FLA's, with the Mamba2 scan named
    apart when it runs on mamba-ssm's kernels, and only for a model with Mamba2 sublayers."""
    config = load_recipe("tiny").model.to_config(kernel_backend="auto")  # Mamba2, GDN, KDA, MLA
    assert kernels_in_use(config, torch.device("cpu")) == "torch"
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(backend_module, "fla_import_error", lambda: None)
    monkeypatch.setattr(backend_module, "fla_backward_blocker", lambda index=0: None)
    monkeypatch.setattr(backend_module, "mamba_ssm_import_error", lambda: None)
    assert kernels_in_use(config, cuda) == "fla (Mamba2 scan: mamba_ssm)"
    gdn = load_recipe("tiny-gdn").model.to_config(kernel_backend="auto")
    assert kernels_in_use(gdn, cuda) == "fla"
    monkeypatch.setattr(backend_module, "mamba_ssm_import_error", lambda: "mamba-ssm is not installed")
    assert kernels_in_use(config, cuda) == "fla"
    with pytest.raises(ZebraError, match=r"model\.kernel_backend=mamba_ssm: .*mamba-ssm is not installed"):
        kernels_in_use(load_recipe("tiny").model.to_config(kernel_backend="mamba_ssm"), cuda)
