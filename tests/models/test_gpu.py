"""GPU checks of the model library (`pytest -m gpu`): a full 1B forward+backward on FLA kernels, FLA vs torch
backends on the tiny hybrid, and a CUDA-graph-captured decode step over the static cache."""

from __future__ import annotations

import math

import pytest
import torch
from tests.models.tiny import tiny_config

from zebra.models import ZebraCache, ZebraForCausalLM
from zebra.recipes import load_recipe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]


def needs_fla():
    from zebra_kernels.backend import fla_backward_blocker, fla_import_error

    reason = fla_import_error() or fla_backward_blocker(torch.cuda.current_device())
    if reason:
        pytest.skip(reason)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_1b_gdn_pure_forward_backward_bf16_on_fla():
    needs_fla()
    config = load_recipe("1b-gdn-pure").model.to_config(kernel_backend="fla")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = ZebraForCausalLM(config).to(torch.bfloat16).train()
    ids = torch.randint(0, config.vocab_size, (2, 2048), device="cuda")
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert abs(loss.item() - math.log(config.vocab_size)) < 1.0  # near-uniform predictions at initialisation
    bad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert bad == []


@torch.no_grad()
def test_tiny_hybrid_fla_and_torch_backends_agree():
    needs_fla()
    torch.manual_seed(0)
    models = {}
    for backend in ("torch", "fla"):
        torch.manual_seed(0)
        models[backend] = ZebraForCausalLM(tiny_config("tiny", kernel_backend=backend, initializer_range=0.1))
        models[backend] = models[backend].cuda().float().eval()
    models["fla"].load_state_dict(models["torch"].state_dict())
    ids = torch.randint(0, 272, (2, 100), device="cuda")
    full = {b: m(ids, use_cache=False).logits for b, m in models.items()}
    assert relative_error(full["fla"], full["torch"]) < 5e-3  # FLA may use TF32 dots in fp32
    decoded = {}
    for (
        backend,
        model,
    ) in models.items():  # prefill 90 (chunk kernels), then 10 single steps (recurrent kernels)
        cache = ZebraCache(model.config)
        steps = [model(ids[:, :90], cache=cache).logits]
        steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(90, 100)]
        decoded[backend] = torch.cat(steps, dim=1)
    assert relative_error(decoded["fla"], decoded["torch"]) < 5e-3
    assert relative_error(decoded["fla"], full["fla"]) < 5e-3


@pytest.mark.parametrize("recipe", ["tiny", "tiny-gla"])
@pytest.mark.parametrize("backend", ["torch", "fla"])
@torch.no_grad()
def test_static_cache_decode_step_replays_from_a_cuda_graph(backend, recipe):
    if backend == "fla":
        needs_fla()
    torch.manual_seed(0)
    model = ZebraForCausalLM(tiny_config(recipe, kernel_backend=backend, initializer_range=0.1)).cuda().eval()
    B, prompt, steps = 2, 12, 6
    ids = torch.randint(0, 272, (B, prompt + steps), device="cuda")
    eager = ZebraCache(
        model.config, batch_size=B, max_length=prompt + steps, dtype=torch.float32, device="cuda"
    )
    model(ids[:, :prompt], cache=eager)
    expected = [model(ids[:, t : t + 1], cache=eager).logits for t in range(prompt, prompt + steps)]

    cache = ZebraCache(
        model.config, batch_size=B, max_length=prompt + steps, dtype=torch.float32, device="cuda"
    )
    model(ids[:, :prompt], cache=cache)
    token = ids[:, prompt : prompt + 1].clone()
    snapshot = cache.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph (kernel autotuning, lazy init)
        for _ in range(2):
            model(token, cache=cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = model(token, cache=cache).logits
    for layer, saved in zip(cache.layers, snapshot.layers, strict=True):  # undo warm-up and capture
        if layer is not None:
            for name, t in layer.tensors().items():
                t.copy_(saved.tensors()[name])
    cache.offset_tensor.copy_(snapshot.offset_tensor)
    got = []
    for t in range(prompt, prompt + steps):
        token.copy_(ids[:, t : t + 1])
        graph.replay()
        got.append(logits.clone())
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_tiny_mamba_on_mamba_ssm_matches_torch_backend_with_gradients():
    """kernel_backend="mamba_ssm" (mamba-ssm's chunked scan for the Mamba2 sublayers, FLA for the rest) gives
    the torch backend's loss and gradients on the tiny Mamba2 model (fp32 weights, T not a chunk multiple)."""
    needs_fla()
    from zebra_kernels.backend import mamba_ssm_import_error

    if mamba_ssm_import_error():
        pytest.skip(mamba_ssm_import_error())
    ids = torch.randint(0, 272, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    results = {}
    for backend in ("torch", "mamba_ssm"):
        torch.manual_seed(0)
        model = ZebraForCausalLM(tiny_config("tiny-mamba", kernel_backend=backend, initializer_range=0.1))
        model = model.cuda().float().train()
        loss = model(ids, labels=ids).loss
        loss.backward()
        results[backend] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    (loss_ref, grads_ref), (loss, grads) = results["torch"], results["mamba_ssm"]
    assert abs(loss.item() - loss_ref.item()) < 1e-3 * abs(loss_ref.item())
    worst = max(relative_error(grads[n], grads_ref[n]) for n in grads_ref if grads_ref[n].norm() > 0)
    assert worst < 2e-2  # Triton dots may run in TF32
