"""TrainStep's loss strategies: Zebra's fused loss inside forward gives the same step (loss, gradient norm, update)
as the logits path, both equal the mean CE over the global batch's unmasked tokens, and the bench's FLA strategy
scores the same targets through FLA's own label shifting. float64 on CPU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tests.models.tiny import tiny_model
from tests.train.helpers import cpu_and_gpu

from zebra.bench.train import labels_loss_sum
from zebra.train.dist import DistEnv
from zebra.train.step import TrainStep, logits_loss_sum, micro_batch_loss, zebra_loss_sum

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def micro_batches(vocab: int, m=2, T=10, count=2, seed=0):
    """`count` micro-batches of `m` sequences, aligned tokens/labels, and loss masks with zeros in them."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        text = torch.randint(0, vocab, (m, T + 1), generator=gen)  # [m, T + 1]
        mask = (torch.rand(m, T, generator=gen) > 0.3).float()  # [m, T]
        batches.append({"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": mask})
    return batches


def run_step(loss_fn, batches):
    """One SGD step (lr 1, no clipping) on a fresh tiny model: the result and each parameter's change."""
    model = tiny_model("tiny").train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    step = TrainStep(
        model, torch.optim.SGD(model.parameters(), lr=1.0), None, ENV, autocast_bf16=False, clip_grad=0.0,
        loss_fn=loss_fn,
    )  # fmt: skip
    result = step(batches)
    return result, {n: p.detach() - before[n] for n, p in model.named_parameters()}


def test_zebra_strategy_is_the_default_for_zebra_models_only():
    assert micro_batch_loss(tiny_model("tiny")) is zebra_loss_sum
    assert micro_batch_loss(fla_tiny_model()) is logits_loss_sum


def reference_step(batches):
    """The mean CE over every unmasked token of the batches from eval-mode float64 logits, and the SGD (lr 1)
    update its gradient gives."""
    model = tiny_model("tiny")
    tokens = sum(int(b["loss_mask"].sum()) for b in batches)
    total = 0.0
    for b in batches:
        keep = b["loss_mask"] > 0  # [m, T]
        logits = model(b["tokens"], use_cache=False).logits  # [m, T, V]
        ce = F.cross_entropy(logits[keep], b["labels"][keep], reduction="sum")
        (ce / tokens).backward()
        total += ce.item()
    return total / tokens, {n: -p.grad for n, p in model.named_parameters()}


def test_zebra_fused_step_equals_the_logits_step_and_the_mean_ce():
    batches = micro_batches(tiny_model("tiny").config.vocab_size)
    fused, fused_update = run_step(zebra_loss_sum, batches)
    logits, logits_update = run_step(logits_loss_sum, batches)
    loss, update = reference_step(batches)
    assert fused.tokens == logits.tokens == sum(int(b["loss_mask"].sum()) for b in batches)
    # the step reports the loss accumulated in float32; the logits path upcasts the logits to float32 only
    assert fused.loss == pytest.approx(loss, rel=1e-6) and logits.loss == pytest.approx(loss, rel=1e-6)
    assert fused.grad_norm == pytest.approx(logits.grad_norm, rel=1e-6) and fused.grad_norm > 0
    for n, delta in update.items():
        torch.testing.assert_close(fused_update[n], delta, atol=1e-12, rtol=1e-10, msg=n)
        torch.testing.assert_close(logits_update[n], delta, atol=1e-7, rtol=1e-5, msg=n)


def fla_tiny_model():
    """FLA's real GatedDeltaNetForCausalLM with no sublayers and torch norm/CE, so it runs on CPU (FLA's
    kernels do not); its loss path (label shift, ignore_index, mean) is the one the bench uses on GPUs."""
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    torch.manual_seed(0)
    config = GatedDeltaNetConfig(
        hidden_size=32, num_hidden_layers=0, vocab_size=64, fuse_norm=False, fuse_cross_entropy=False
    )
    return GatedDeltaNetForCausalLM(config).double().train()


def test_fla_strategy_scores_the_same_targets_except_the_last_position():
    model = fla_tiny_model()
    (batch,) = micro_batches(64, count=1)
    tokens, labels, mask = batch["tokens"], batch["labels"], batch["loss_mask"]
    got = labels_loss_sum(model, tokens, labels, mask)
    with torch.no_grad():
        logits = model(input_ids=tokens, use_cache=False).logits  # [m, T, V]
    keep = mask[:, :-1] > 0  # FLA leaves position T-1 without a target
    expected = F.cross_entropy(logits[:, :-1][keep], labels[:, :-1][keep], reduction="sum")
    torch.testing.assert_close(got.detach(), expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("device", cpu_and_gpu())
def test_a_fused_adamw_clips_as_clip_grad_norm_does(device):
    """With a fused AdamW the clipping happens inside the update (`grad_scale`): after three clipped steps the
    weights match those of the unfused AdamW after `clip_grad_norm_`, and each step reports the same norm."""
    weights, norms = {}, {}
    for fused in (False, True):
        torch.manual_seed(0)
        model = tiny_model("tiny").train().float().to(device)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=1e-2, fused=fused, foreach=False if not fused else None
        )
        env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device(device))
        step = TrainStep(model, optimizer, None, env, autocast_bf16=False, clip_grad=0.05)
        assert step.skip_on_device == fused
        norms[fused] = [step(micro_batches(model.config.vocab_size, seed=i)).grad_norm for i in range(3)]
        weights[fused] = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert min(norms[False]) > 0.05  # every step was clipped
    assert norms[True] == pytest.approx(norms[False], rel=1e-5)
    # Adam's m / (sqrt(v) + eps) amplifies rounding in tiny gradients to a few 1e-6 (fused against unfused AdamW,
    # both clipped first, differ as much); without the clipping the weights differ by about 3e-2
    for name, w in weights[False].items():
        torch.testing.assert_close(weights[True][name], w, rtol=1e-4, atol=5e-5, msg=name)


@pytest.mark.parametrize("device", cpu_and_gpu())
def test_a_fused_adamw_skips_a_non_finite_step_itself(device):
    """With torch's fused AdamW the step decides on the device (`found_inf`) whether to update, with no host read
    before the update: a NaN loss leaves weights, moments and step counts as they were; the next finite step
    updates. The figures are read afterwards (`StepResult`; on a GPU copied to the host behind the step)."""
    model = tiny_model("tiny").train().float().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device(device))
    step = TrainStep(model, optimizer, None, env, autocast_bf16=False, clip_grad=1.0)
    assert step.skip_on_device
    batches = micro_batches(model.config.vocab_size)
    assert step(batches).applied
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = {n: optimizer.state[p]["exp_avg"].clone() for n, p in model.named_parameters()}

    def nan_loss(model, tokens, labels, mask):
        return zebra_loss_sum(model, tokens, labels, mask) * float("nan")

    step.loss_fn = nan_loss
    skipped = step(batches)
    assert not skipped.applied and math.isnan(skipped.loss)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
        assert torch.equal(optimizer.state[p]["exp_avg"], moments[n]), n
        assert optimizer.state[p]["step"].item() == 1, n
    step.loss_fn = zebra_loss_sum
    assert step(batches).applied
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    assert all(optimizer.state[p]["step"].item() == 2 for p in model.parameters())
