"""Training-side behaviour: every parameter gets a gradient, labels are shifted inside, the loss is float32,
logits_to_keep, gradient checkpointing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.models.tiny import TINY_RECIPES, tiny_model


def batch(model, B=2, T=12, seed=0):
    return torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", TINY_RECIPES)
def test_every_parameter_gets_a_gradient(name):
    model = tiny_model(name).train()
    ids = batch(model)
    model(ids, labels=ids).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_labels_are_shifted_inside_and_minus_100_is_ignored():
    model = tiny_model("tiny")
    ids = batch(model)
    labels = ids.clone()
    labels[0, 5:] = -100
    out = model(ids, labels=labels)
    logits = out.logits[:, :-1]
    keep = labels[:, 1:] != -100
    expected = F.cross_entropy(logits[keep], labels[:, 1:][keep])
    torch.testing.assert_close(out.loss, expected, atol=1e-12, rtol=0)


def test_loss_is_float32_for_a_bfloat16_model():
    model = tiny_model("tiny").to(torch.bfloat16)
    ids = batch(model)
    out = model(ids, labels=ids)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    assert torch.isfinite(out.loss)


def test_logits_to_keep():
    model = tiny_model("tiny")
    ids = batch(model)
    with torch.no_grad():
        full = model(ids).logits
        torch.testing.assert_close(model(ids, logits_to_keep=1).logits, full[:, -1:])
        torch.testing.assert_close(model(ids, logits_to_keep=torch.tensor([0, 4])).logits, full[:, [0, 4]])
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, labels=ids, logits_to_keep=1)


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        model = tiny_model("tiny").train()
        if checkpointing:
            model.gradient_checkpointing_enable()
            assert all(layer.gradient_checkpointing for layer in model.model.layers)
        ids = batch(model)
        model(ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-12, rtol=0, msg=name)


def test_initialisation_follows_fla_and_megatron():
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    torch.manual_seed(0)
    config = load_recipe("tiny").model.to_config(hidden_size=256, intermediate_size=512)  # enough samples
    model = ZebraForCausalLM(config)
    layers, std = model.model.layers, config.initializer_range
    out_std = std / (2 * config.num_hidden_layers) ** 0.5
    assert layers[1].mixer.up_proj.weight.std().item() == pytest.approx(std, rel=0.05)
    assert layers[1].mixer.down_proj.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert layers[0].mixer.o_proj.weight.std().item() == pytest.approx(out_std, rel=0.1)
    mamba, gdn, kda = layers[2].mixer, layers[4].mixer, layers[6].mixer
    assert mamba.out_proj.weight.std().item() == pytest.approx(out_std, rel=0.05)
    for mixer, low in ((gdn, 0.0), (kda, 1.0), (mamba, 1.0)):
        A = mixer.A_log.exp()
        assert A.dtype == torch.float32 and bool(A.gt(low).all()) and bool(A.lt(16).all())
        dt = F.softplus(mixer.dt_bias)
        assert (dt >= 1e-3 - 1e-7).all() and (dt <= 0.1 + 1e-7).all()
    assert torch.equal(mamba.D, torch.ones_like(mamba.D))
    bound = 1 / mamba.conv1d.weight.shape[-1] ** 0.5  # kaiming_uniform(a=sqrt(5)) over fan_in = W
    assert mamba.conv1d.weight.abs().max() <= bound and mamba.conv1d.weight.std() > bound / 2
    assert gdn.q_conv1d.weight.std().item() == pytest.approx(std, rel=0.2)  # FLA: convs ~ N(0, std)
    assert all(
        torch.equal(m.weight, torch.ones_like(m.weight))
        for m in model.modules()
        if "Norm" in type(m).__name__
    )
