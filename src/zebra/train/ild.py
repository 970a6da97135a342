"""The micro-batch loss of intermediate-layer distillation (`distill.stage: ild`), a `MicroBatchLoss`.

Teacher-forced, as in Zebra-Llama: student layer l (sublayers 2l, 2l+1: mixer, MLP) gets the teacher's stream
before teacher layer l, and the loss of a micro-batch is, summed over the counted tokens (the step divides by
their number, so the objective is the per-layer mean over tokens, summed over layers):

    sum_l  d(h_s^l, h_t^l) + d(m_s^l, m_t^l)
    h^l  the layer's output (for the last layer: after the final norm)
    m^l  the mixer's output before the residual add (the teacher's attention after o_proj)
    d    ||a - b||_2 per token (`l2`, published) or mean((a - b)^2) over channels (`mse`)

The teacher's states come from one no-grad pass over the same micro-batch, captured by forward hooks: every
layer's input, its attention output and the final norm's output (2L + 1 tensors `[m, T, D]`, the only ones the
student needs; the teacher's logits are skipped with `logits_to_keep=1`). The student runs inside its own
forward (`ZebraForCausalLM(teacher_forcing=...)`) so FSDP2 / DDP hooks fire as usual. The student's embeddings
and head get no gradient (it never embeds or predicts a token here): the trainer freezes them for this stage.

Reported parts (`metric_names`): `hidden` and `mixer` (the two terms summed over layers) and `layers_a-b`
(both terms of up to `GROUPS` consecutive layer groups).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

GROUPS = 4  # layer groups reported separately


def layer_groups(num_layers: int) -> list[range]:
    """Up to `GROUPS` ranges of consecutive layers, as equal as possible."""
    count = min(GROUPS, num_layers)
    bounds = [round(k * num_layers / count) for k in range(count + 1)]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def metric_names(num_layers: int) -> tuple[str, ...]:
    groups = [f"layers_{g.start}-{g.stop - 1}" for g in layer_groups(num_layers)]
    return ("hidden", "mixer", *groups)


def teacher_states(teacher: torch.nn.Module, tokens: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """The teacher's per-layer `inputs`, attention outputs (`mixers`) and `outputs` (the last one after the final
    norm), each `[m, T, D]`, from one no-grad forward of an HF Llama-family causal LM."""
    import torch

    layers = teacher.model.layers
    states: dict[str, list[torch.Tensor]] = {"inputs": [], "mixers": [], "final": []}

    def take_input(_module, args, kwargs):
        states["inputs"].append(args[0] if args else kwargs["hidden_states"])

    handles = [layer.register_forward_pre_hook(take_input, with_kwargs=True) for layer in layers]
    handles += [layer.self_attn.register_forward_hook(lambda _m, _a, out: states["mixers"].append(out[0]))
                for layer in layers]  # fmt: skip
    handles.append(teacher.model.norm.register_forward_hook(lambda _m, _a, out: states["final"].append(out)))
    try:
        with torch.no_grad():
            teacher(input_ids=tokens, use_cache=False, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
    return {
        "inputs": states["inputs"],
        "mixers": states["mixers"],
        "outputs": states["inputs"][1:] + states["final"],
    }


class _Forcing:
    """What `ZebraModel.teacher_forced` asks for: the teacher's input to layer l, and layer l's loss."""

    def __init__(self, states, mask: torch.Tensor, norm: str, sums: torch.Tensor, groups: list[range]):
        self.states, self.mask, self.norm, self.sums, self.groups = states, mask, norm, sums, groups

    def layer_input(self, i: int) -> torch.Tensor:
        return self.states["inputs"][i]

    def distance(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """Summed over the counted tokens of the per-token distance (float32 scalar)."""
        diff = student.float() - teacher.float()  # [m, T, D]
        per_token = diff.pow(2).mean(-1) if self.norm == "mse" else diff.pow(2).sum(-1).add(1e-12).sqrt()
        return (per_token * self.mask).sum()

    def layer_loss(self, i: int, mixed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        hidden = self.distance(out, self.states["outputs"][i])
        mixer = self.distance(mixed, self.states["mixers"][i])
        group = next(k for k, g in enumerate(self.groups) if i in g)
        self.sums[0] += hidden.detach()
        self.sums[1] += mixer.detach()
        self.sums[2 + group] += hidden.detach() + mixer.detach()
        return hidden + mixer


class ILDLoss:
    """(summed ILD objective, per-part sums) of a micro-batch against a frozen teacher with `num_layers` layers."""

    def __init__(self, teacher: torch.nn.Module, num_layers: int, norm: str = "l2"):
        self.teacher, self.norm = teacher, norm
        self.groups = layer_groups(num_layers)
        self.metric_names = metric_names(num_layers)

    def __call__(
        self, model: torch.nn.Module, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        states = teacher_states(self.teacher, tokens)
        sums = torch.zeros(len(self.metric_names), device=tokens.device)
        forcing = _Forcing(states, loss_mask.float(), self.norm, sums, self.groups)
        objective = model(teacher_forcing=forcing, use_cache=False).loss
        return objective, sums
