"""The model options of Kimi-Linear's form: a KDA output gate without bias, and MLA without RoPE (NoPE)."""

from __future__ import annotations

import torch

from zebra.models import ZebraForCausalLM
from zebra.recipes import load_recipe


def test_kda_without_gate_bias_has_no_bias_and_the_counted_parameters():
    from zebra.spec import arch

    for gate_bias in (True, False):
        config = load_recipe("tiny-kimi").model.to_config(kernel_backend="torch", kda_gate_bias=gate_bias)
        model = ZebraForCausalLM(config)
        names = {n for n, _ in model.named_parameters()}
        assert ("model.layers.0.mixer.g_proj.1.bias" in names) == gate_bias
        assert sum(p.numel() for p in model.parameters()) == arch.param_count(config).total


def test_nope_mla_sees_no_order_but_rope_does():
    """With `mla.rope: false` attention carries no position: the last token's output is the same whatever the
    order of the tokens before it; with RoPE it is not."""
    from zebra.models.layers.mla import MultiLatentAttention

    config = load_recipe("tiny-kimi").model.to_config(kernel_backend="torch")
    changes = {}
    for use_rope in (False, True):
        torch.manual_seed(0)
        layer = MultiLatentAttention.from_config(config, 6)
        layer.use_rope = use_rope
        x = torch.randn(1, 7, config.hidden_size)
        shuffled = torch.cat([x[:, torch.tensor([4, 2, 0, 5, 1, 3])], x[:, 6:]], dim=1)
        positions = torch.arange(7)[None]
        with torch.no_grad():
            last = layer(x, position_ids=positions)[:, -1]
            last_shuffled = layer(shuffled, position_ids=positions)[:, -1]
        changes[use_rope] = float((last - last_shuffled).abs().max())
    assert changes[False] < 1e-6
    assert changes[True] > 1e-3


def test_nope_mla_decodes_with_its_cache_as_it_prefills():
    config = load_recipe("tiny-kimi").model.to_config(kernel_backend="torch")
    torch.manual_seed(0)
    model = ZebraForCausalLM(config).eval()
    ids = torch.randint(0, 259, (1, 12))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :8], use_cache=True)
        steps = [out.logits]
        cache = (
            out.past_key_values
            if hasattr(out, "past_key_values") and out.past_key_values is not None
            else out.cache
        )
        for t in range(8, 12):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


def test_kda_without_gate_bias_is_refused_by_the_fla_export_in_one_line():
    """FLA's KimiDeltaAttention always has the output-gate bias: `--to fla` refuses the Kimi form, naming the field
    and the export that fits, instead of writing a checkpoint FLA would load with a missing tensor."""
    import pytest

    from zebra.convert.fla_format import fla_config
    from zebra.core.errors import ZebraError

    config = load_recipe("tiny-kimi").model.to_config(kernel_backend="torch")
    with pytest.raises(ZebraError, match=r"model\.kda\.gate_bias=false") as refused:
        fla_config(config, "K-K-")
    assert "--to kimi-linear" in refused.value.fix
