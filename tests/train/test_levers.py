"""The training levers `zebra bench train --set train.X=...` toggles: fused input projections (checked against the
unfused path), regional compile, float8's layer choice and its missing-torchao error, the CUDA-graphed
optimizer step (GPU) and float8 training (CPU with torchao; GPU)."""

from __future__ import annotations

import copy
import importlib.util
import math
import re
import sys

import pytest
import torch
from tests.models.tiny import tiny_model
from tests.train.helpers import cpu_and_gpu, losses, sets

from zebra.core.errors import ZebraError
from zebra.recipes import load_recipe
from zebra.train.parallelize import (
    apply_compile,
    apply_float8,
    apply_fused_projections,
    check_float8_device,
    eager_float8_note,
    float8_eligible,
    sublayer_letter,
)

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fused_projections_give_the_unfused_loss_and_gradients():
    """One GEMM over the concatenated weights (MLA q_down + kv_down, GDN / KDA input projections) is the same
    math: float64 loss and every parameter's gradient agree to rounding, and every projection gets a gradient."""
    model = tiny_model("tiny").train()  # MLA, Mamba2, GDN and KDA sublayers
    fused = copy.deepcopy(model)
    switched = apply_fused_projections(fused)
    pattern = model.config.layer_pattern
    assert switched == sum(pattern.count(c) for c in "*GK")  # Mamba2 has one in_proj: nothing to fuse
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    loss, grads = loss_and_grads(model, ids)
    fused_loss, fused_grads = loss_and_grads(fused, ids)
    assert fused_grads.keys() == grads.keys() and any("q_down_proj" in n for n in grads)
    torch.testing.assert_close(fused_loss, loss, rtol=1e-12, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_fused_projections_leave_decode_unchanged():
    model = tiny_model("tiny").eval()
    fused = copy.deepcopy(model)
    apply_fused_projections(fused)
    ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).logits, model(ids).logits, rtol=1e-10, atol=1e-12)


def test_regional_compile_compiles_only_the_chosen_sublayers():
    model = tiny_model("tiny")
    apply_compile(model, "-*")
    compiled = {sublayer_letter(layer): layer._compiled_call_impl is not None for layer in model.model.layers}
    assert compiled == {"-": True, "*": True, "M": False, "G": False, "K": False}
    with pytest.raises(ZebraError, match=r"train\.compile_sublayers='x-'"):
        apply_compile(tiny_model("tiny"), "x-")


def test_float8_converts_the_large_linear_layers_only():
    config = load_recipe("1b-mamba-mla").model.to_config()
    from zebra.models import ZebraForCausalLM

    with torch.device("meta"):
        model = ZebraForCausalLM(config)
    chosen = {name.split(".")[-1] for name, m in model.named_modules() if float8_eligible(m, name)}
    # MLA's kv_down_proj is 2048 -> 160 and Mamba2's in_proj 2048 -> 5152: multiples of 16, above 128
    assert chosen == {"q_down_proj", "q_up_proj", "kv_down_proj", "kv_up_proj", "o_proj", "in_proj", "out_proj",
                      "gate_proj", "up_proj", "down_proj"}  # fmt: skip
    gdn = load_recipe("1b-gdn-pure").model.to_config()
    with torch.device("meta"):
        model = ZebraForCausalLM(gdn)
    left_out = {name.split(".")[-1] for name, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and not float8_eligible(m, name)}  # fmt: skip
    assert left_out == {"a_proj", "b_proj", "lm_head"}  # 2048 -> 16 gates: too small to pay for FP8 casts
    assert not float8_eligible(model.lm_head, "lm_head")


@pytest.mark.slow
def test_regional_compile_gives_the_eager_loss_and_gradients():
    """Compiling the MLP and MLA sublayers (inductor on CPU) changes the graph, not the math: the float64 loss
    and every gradient match the eager model's to rounding."""
    model = tiny_model("tiny").train()
    compiled = copy.deepcopy(model)
    apply_compile(compiled, "-*")
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(2))
    loss, grads = loss_and_grads(model, ids)
    compiled_loss, compiled_grads = loss_and_grads(compiled, ids)
    assert compiled_grads.keys() == grads.keys()
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-10, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-8, atol=1e-10, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_regional_compile_on_a_gpu_hands_on_the_stream_in_its_shape():
    """On a GPU the streams cross between compiled MLPs (their norm left to inductor) and eager MLA sublayers
    (zebra's Triton RMSNorm) both ways: each keeps its [B, T, D] shape (a compiled sublayer once handed on the
    flat [B*T, D] buffer behind our norm's view, which the next norm refused), and loss and gradients follow the
    eager model's. MLA and MLPs only, so no FLA kernel autotunes for these tiny shapes (minutes when cold)."""
    model = tiny_model("tiny", kernel_backend="auto", layer_pattern="*-*-*-*-").float().cuda().train()
    compiled = copy.deepcopy(model)
    apply_compile(compiled, "-")  # the MLPs compiled, the mixers eager: streams cross the boundary both ways
    ids = torch.randint(0, model.config.vocab_size, (2, 64), device="cuda")
    loss, grads = loss_and_grads(model, ids)
    compiled_loss, compiled_grads = loss_and_grads(compiled, ids)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-4, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)


def test_float8_sublayers_are_checked_before_torchao_is_needed():
    """A typo in train.fp8_sublayers is named (with or without torchao installed), not a failed import."""
    with pytest.raises(ZebraError, match=r"train\.fp8_sublayers='mlp'") as info:
        apply_float8(tiny_model("tiny"), "mlp")
    assert "--set train.fp8_sublayers=" in info.value.fix


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_float8_on_the_chosen_sublayers_only():
    """train.fp8_sublayers='-': the MLPs' Linear layers become float8, the Mamba2 mixer's (float8 with 'all' at
    this width) stay bf16 Linear."""
    from torchao.float8.float8_linear import Float8Linear

    from zebra.models import ZebraForCausalLM

    config = load_recipe("tiny").model.to_config(hidden_size=256, intermediate_size=1024)
    float8_in = {}
    for which in ("all", "-"):
        model = ZebraForCausalLM(config)
        apply_float8(model, which)
        float8_in[which] = {sublayer_letter(layer): any(isinstance(m, Float8Linear) for m in layer.modules())
                            for layer in model.model.layers}  # fmt: skip
        assert not isinstance(model.lm_head, Float8Linear)
    # MLA's, GDN's and KDA's projections at width 256 are below FLOAT8_MIN_DIM: bf16 either way
    assert float8_in["all"] == {"-": True, "*": False, "M": True, "G": False, "K": False}
    assert float8_in["-"] == {"-": True, "*": False, "M": False, "G": False, "K": False}


@pytest.mark.parametrize(
    ("levers", "eager", "fix"),
    [
        ({"fp8": False}, None, None),
        ({}, "-", "--set train.compile=true --set train.compile_sublayers=-"),
        ({"compile": True}, None, None),  # the defaults: float8 MLPs, every sublayer compiled
        ({"compile": True, "compile_sublayers": "-"}, None, None),
        ({"fp8_sublayers": "all", "compile": True, "compile_sublayers": "-"}, "*GKM",
         "--set train.compile_sublayers=*-GKM, or float8 only where compiled: --set train.fp8_sublayers=-"),
        ({"fp8_sublayers": "G-", "compile": True, "compile_sublayers": "*-"}, "G", "train.compile_sublayers=*-G,"),
    ],
)  # fmt: skip
def test_float8_layers_left_eager_are_warned_about_with_the_keys_that_compile_them(levers, eager, fix):
    """torchao's float8 casts run as kernels of their own outside compiled code: FP8 on eager sublayers ran 40%
    slower than bf16. The trainer warns, naming the sublayer kinds and the --set that compiles them."""
    import dataclasses

    train = dataclasses.replace(load_recipe("tiny").train, **{"fp8": True, **levers})
    note = eager_float8_note(tiny_model("tiny").config.layer_pattern, train)  # sublayers *-M-G-K-
    if eager is None:
        assert note is None
    else:
        assert f"the float8 layers of the {eager!r} sublayers run eager" in note and fix in note


@pytest.mark.parametrize(
    ("hip", "capability", "arch", "refused"),
    [
        (None, (8, 0), "", "NVIDIA A100 (sm_80) has no float8 GEMMs"),
        (None, (9, 0), "", None),
        (None, (8, 9), "", None),
        ("6.4", (9, 0), "gfx90a:sramecc+:xnack-", "AMD Instinct MI250X (gfx90a) has no float8 GEMMs"),
        ("6.4", (9, 4), "gfx942:sramecc+:xnack-", None),
    ],
)
def test_float8_on_a_gpu_without_float8_gemms_is_refused_in_one_line(
    monkeypatch, hip, capability, arch, refused
):
    """A100s and MI250s have no float8 GEMMs: torch's `_scaled_mm` failed inside the first step. (The GPU is
    faked: this machine has none.)"""
    import types

    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    name = "AMD Instinct MI250X" if hip else "NVIDIA A100"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: types.SimpleNamespace(gcnArchName=arch, major=capability[0], minor=capability[1]),
    )
    check_float8_device(torch.device("cpu"))  # the CPU runs it through torch's own _scaled_mm
    if refused is None:
        check_float8_device(torch.device("cuda", 0))
        return
    with pytest.raises(ZebraError, match=re.escape(refused)) as info:
        check_float8_device(torch.device("cuda", 0))
    assert info.value.fix.startswith("drop train.fp8; it needs NVIDIA sm89+")


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
@pytest.mark.parametrize(("recipe", "granularity"), [("rowwise", "AXISWISE"), ("tensorwise", "TENSORWISE")])
def test_the_float8_recipe_sets_the_scales(recipe, granularity):
    """train.fp8_recipe reaches torchao: a scale per row of each operand, or one per tensor."""
    from torchao.float8.float8_linear import Float8Linear

    from zebra.models import ZebraForCausalLM

    model = ZebraForCausalLM(load_recipe("tiny").model.to_config(hidden_size=256, intermediate_size=1024))
    apply_float8(model, "-", recipe)
    converted = [m for m in model.modules() if isinstance(m, Float8Linear)]
    scales = {m.config.cast_config_input.scaling_granularity.name for m in converted}
    assert converted and scales == {granularity}


def test_float8_without_torchao_is_one_line_with_the_install(monkeypatch):
    model = tiny_model("tiny")
    # as where torchao is not installed: its import fails
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ZebraError, match=r"train\.fp8 needs torchao") as info:
        apply_float8(model)
    assert info.value.fix.startswith("pip install 'zebra-llama[fp8]'")


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_an_fp8_run_warns_resumes_like_the_uninterrupted_run_and_exports(cli, tmp_path, sample_prefix):
    """`zebra train --set train.fp8=true` end to end on the CPU (torch's own `_scaled_mm`): the trainer warns that
    the float8 MLPs run eager, naming the keys that compile them; a run resumed from the step-4 checkpoint of
    another logs that run's losses for steps 5-8 (torchao's Float8Linear keeps the parameter names, and tensorwise
    scales are recomputed from the tensors every step: no scale state to lose); the export loads as a plain model
    (no float8 layers) whose logits are finite."""
    from zebra.models import ZebraForCausalLM

    # the narrowest float8 MLPs (FLOAT8_MIN_DIM) on 2 x 32 tokens a step: torch's CPU `_scaled_mm` is a plain
    # loop (1.2 s for one 256 x 256 x 1024 product), and 256-wide MLPs at 8 x 32 tokens made this test 5 minutes
    levers = ("model.hidden_size=128", "model.intermediate_size=256", "train.fp8=true", "train.global_batch_size=2",
              "train.micro_batch_size=2", "train.save_interval=4", "train.export=true")  # fmt: skip

    def train(run: str, *extra: str):
        result = cli("train", "tiny-gdn", "--data", sample_prefix, "--max-steps", "8", "--output", str(tmp_path),
                     "--run", run, *extra, *sets(*levers))  # fmt: skip
        assert result.exit_code == 0, result.output
        return result.output

    output = train("whole")
    assert "the float8 layers of the '-' sublayers run eager" in output
    assert "--set train.compile=true --set train.compile_sublayers=-" in output
    whole = losses(tmp_path / "whole")
    assert sorted(whole) == list(range(1, 9)) and all(math.isfinite(v) for v in whole.values())
    train("resumed", "--resume", str(tmp_path / "whole" / "checkpoints" / "step_0000004"), "--yes")
    resumed = losses(tmp_path / "resumed")
    for step in range(5, 9):
        assert resumed[step] == pytest.approx(whole[step], rel=1e-5), step
    exported = ZebraForCausalLM.from_pretrained(tmp_path / "whole" / "export")
    assert {type(m).__name__ for m in exported.modules()}.isdisjoint({"Float8Linear"})
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(exported(ids).logits).all()


def test_optimizer_graph_needs_a_gpu(tmp_path):
    from zebra.train.optim import build_optimizer
    from zebra.train.run import RankLayout, resolve_run

    recipe = load_recipe("tiny", overrides=["train.optimizer_graph=true"])
    with pytest.raises(ZebraError, match=r"train\.optimizer_graph needs a CUDA GPU"):
        resolve_run(recipe, RankLayout("cpu", nodes=1, ranks_per_node=1), output=tmp_path)
    with pytest.raises(ZebraError, match=r"train\.optimizer_graph needs a CUDA GPU"):
        build_optimizer(tiny_model("tiny"), recipe.train, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_optimizer_step_follows_the_eager_one():
    """TrainStep with the AdamW step replayed from a CUDA graph: the same weights as the eager fused step after
    several steps under a changing learning rate (warm-up schedule)."""
    from zebra.train.dist import DistEnv
    from zebra.train.optim import build_optimizer, build_scheduler, lr_at
    from zebra.train.step import TrainStep

    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cuda"))
    ids = torch.randint(0, 272, (2, 65), generator=torch.Generator().manual_seed(0))
    batch = {"tokens": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": torch.ones(2, 64)}
    weights = {}
    for graphed in (False, True):
        spec = load_recipe(
            "tiny", overrides=[f"train.optimizer_graph={graphed}", "train.warmup_steps=4"]
        ).train
        torch.manual_seed(0)
        model = tiny_model("tiny").float().cuda().train()
        optimizer = build_optimizer(model, spec, env.device)
        step = TrainStep(model, optimizer, build_scheduler(optimizer, spec), env, autocast_bf16=False,
                         clip_grad=spec.clip_grad, optimizer_graph=graphed)  # fmt: skip
        for _ in range(5):  # eager, capture + replay, then replays
            assert step([batch]).applied
        weights[graphed] = {n: p.detach().clone() for n, p in model.named_parameters()}
        lr = optimizer.param_groups[0]["lr"]  # a float again after capture, the schedule's value
        assert isinstance(lr, float) and lr == pytest.approx(lr_at(5, spec))
    for name, w in weights[False].items():
        torch.testing.assert_close(weights[True][name], w, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
@pytest.mark.parametrize("device", cpu_and_gpu())
def test_float8_training_step_runs_close_to_bf16(device):
    """train.fp8 on a model wide enough for float8 layers: the first loss within 2% of bf16's, gradients finite
    (on the CPU through torch's CPU `_scaled_mm`, on a GPU through its FP8 GEMMs)."""
    from torchao.float8.float8_linear import Float8Linear

    from zebra.models import ZebraForCausalLM

    backend = "torch" if device == "cpu" else "auto"
    # the narrowest float8 MLPs on the CPU, where torch's `_scaled_mm` is a plain loop
    hidden, inner = (128, 256) if device == "cpu" else (256, 1024)
    config = load_recipe("tiny-gdn").model.to_config(
        hidden_size=hidden, intermediate_size=inner, kernel_backend=backend
    )
    T = 64 if device == "cpu" else 256
    gen = torch.Generator(device).manual_seed(0)
    ids = torch.randint(0, 272, (4, T), device=device, generator=gen)
    losses = {}
    for fp8 in (False, True):
        torch.manual_seed(0)
        model = ZebraForCausalLM(config).to(device).train()
        if fp8:
            apply_float8(model)
            assert any(isinstance(m, Float8Linear) for m in model.modules())
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        losses[fp8] = loss.item()
    assert abs(losses[True] - losses[False]) < 0.02 * losses[False]
