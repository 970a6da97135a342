"""Tiny Zebra models for the model tests: float64 on CPU, the torch kernel backend, seeded weights."""

from __future__ import annotations

import torch

from zebra.recipes import load_recipe

TINY_RECIPES = ("tiny", "tiny-gdn", "tiny-kda", "tiny-gla", "tiny-mamba")


def tiny_config(name: str = "tiny", **overrides):
    """The `ZebraConfig` of a built-in tiny recipe on the torch backend (unless overridden), with overrides."""
    return load_recipe(name).model.to_config(**{"kernel_backend": "torch", **overrides})


def tiny_model(name: str = "tiny", seed: int = 0, **overrides):
    """A float64 eval-mode `ZebraForCausalLM` from a tiny recipe, with weights large enough that attention,
    gates and decays are far from trivial (std 0.1 instead of 0.02)."""
    from zebra.models import ZebraForCausalLM

    torch.manual_seed(seed)
    overrides.setdefault("initializer_range", 0.1)
    return ZebraForCausalLM(tiny_config(name, **overrides)).double().eval()
