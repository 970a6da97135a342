"""`train.forward_backward_graph` on the CPU: the step's bookkeeping around the graph (static inputs, the scale,
gradients created before capture and added into by each replay, a micro-batch of another shape run eagerly)
against the eager step. A CUDA graph cannot exist here: `record` is replaced by a graph that runs the recorded
function again on replay (capture itself runs nothing, so the stand-in restores the gradients it touched). The
real capture is checked on a GPU by tests/train/test_levers.py."""

from __future__ import annotations

import pytest
import torch
from tests.models.tiny import tiny_model

from zebra.recipes import load_recipe
from zebra.train import step as step_module
from zebra.train import step_graph
from zebra.train.dist import DistEnv
from zebra.train.optim import build_optimizer
from zebra.train.step import TrainStep


class ReplayingGraph:
    """Runs `fn(*inputs)` at every replay and writes its results into the outputs handed out at capture."""

    def __init__(self, fn, inputs, outputs):
        self.fn, self.inputs, self.outputs = fn, inputs, outputs
        self.replays = 0

    def replay(self):
        for static, new in zip(self.outputs, self.fn(*self.inputs), strict=True):
            static.copy_(new)
        self.replays += 1


def record_without_running(fn, inputs):
    params = [
        p for p in fn.__self__.params if p.grad is not None
    ]  # fn: the TrainStep's eager forward + backward
    grads = [p.grad.clone() for p in params]
    outputs = tuple(t.clone() for t in fn(*inputs))
    for p, g in zip(params, grads, strict=True):  # a capture records the additions, it does not make them
        p.grad.copy_(g)
    return ReplayingGraph(fn, inputs, outputs), outputs


def warm_up_on_cpu(fn, inputs):
    for _ in range(step_graph.WARMUP_PASSES):
        fn(*inputs)


def test_graphed_step_matches_the_eager_step(monkeypatch):
    """Two micro-batches accumulated per step, varying loss masks (so the scale changes), one step with a
    micro-batch of another length: the same losses and weights as the eager step, and that micro-batch is not
    replayed."""
    monkeypatch.setattr(step_module, "check_graphable", lambda device_type, distributed: None)
    monkeypatch.setattr(step_graph, "record", record_without_running)
    monkeypatch.setattr(step_graph, "warm_up", warm_up_on_cpu)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)

    def micro_batch(T):
        ids = torch.randint(0, 272, (2, T + 1), generator=gen)  # [2, T + 1]
        mask = (torch.rand(2, T, generator=gen) > 0.2).float()  # [2, T]
        return {"tokens": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": mask}

    steps = [[micro_batch(16), micro_batch(16)] for _ in range(3)]
    steps.insert(2, [micro_batch(8)])  # another shape: eager
    losses, weights = {}, {}
    for graphed in (False, True):
        spec = load_recipe("tiny").train
        torch.manual_seed(0)
        model = tiny_model("tiny").double().train()
        model.unused = torch.nn.Parameter(
            torch.ones(3, 3, dtype=torch.float64)
        )  # decayed only if it had a grad
        optimizer = build_optimizer(model, spec, env.device)
        step = TrainStep(model, optimizer, None, env, autocast_bf16=False, clip_grad=spec.clip_grad,
                         forward_backward_graph=graphed)  # fmt: skip
        losses[graphed] = [step(batches).loss for batches in steps]
        weights[graphed] = {n: p.detach().clone() for n, p in model.named_parameters()}
        if graphed:
            assert step.forward_backward.graph.replays == 6  # 3 steps x 2 micro-batches; the short one eager
            assert all(p.grad is not None and not p.grad.any() for p in step.params if p is not model.unused)
            assert model.unused.grad is None
    assert losses[True] == pytest.approx(losses[False], rel=1e-10)
    for name, w in weights[False].items():
        torch.testing.assert_close(weights[True][name], w, rtol=1e-9, atol=1e-12, msg=name)
