"""What the two delta-rule mixers (GDN `zebra.mixers.gdn`, KDA `zebra.mixers.kda`) read and build alike: their
dimensions from and to an FLA config, from a Megatron checkpoint's args, and their upcycling from attention.
GDN has value heads of their own (`num_v_heads`, a multiple of its key heads); KDA has one head count
(`value_heads=False`): an FLA or Megatron model with grouped value heads is refused for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zebra.mixers.spec import UpcycleAdapter, fla_refuse, fla_value_dim

# Zebra's q/k L2 normalisation epsilon (zebra_kernels); llama.cpp uses the model's norm epsilon there (a GGUF
# blocker of both mixers)
L2NORM_EPS = 1e-6


def fla_dims(cfg: dict[str, Any], *, value_heads: bool) -> dict[str, Any]:
    """Heads, key / value channels per head and conv width (and the value heads) from an FLA config dict
    (`FLAAdapter.to_zebra`)."""
    if not value_heads:
        fla_refuse(cfg, "num_v_heads", (None, cfg["num_heads"]), "Zebra's KDA has one head count: convert a "
                   "KDA model without grouped value heads")  # fmt: skip
    dims = {
        "num_heads": cfg["num_heads"],
        "head_dim": cfg["head_dim"],
        "head_v_dim": fla_value_dim(cfg),
        "conv_size": cfg["conv_size"],
    }
    return dims | ({"num_v_heads": cfg.get("num_v_heads") or cfg["num_heads"]} if value_heads else {})


def fla_sizes(z: Any, prefix: str, *, value_heads: bool) -> dict[str, Any]:
    """The sizes of FLA's config.json from the `<prefix>_*` keys of a Zebra config (`FLAAdapter.from_zebra`;
    FLA's `num_v_heads` None: as many as `num_heads`)."""
    heads, head_dim = getattr(z, f"{prefix}_num_heads"), getattr(z, f"{prefix}_head_dim")
    return {
        "head_dim": head_dim,
        "num_heads": heads,
        "num_v_heads": getattr(z, f"{prefix}_num_v_heads") if value_heads else None,
        "expand_v": getattr(z, f"{prefix}_head_v_dim") / head_dim,
        "conv_size": getattr(z, f"{prefix}_conv_size"),
    }


def megatron_dims(arg: Callable[..., Any], *, value_heads: bool) -> dict[str, int]:
    """Key heads (and value heads), channels per head and conv width from a Megatron checkpoint's `linear_*`
    args (`arg(name, default)`, `MegatronAdapter.fields`)."""
    dims = {
        "num_heads": int(arg("linear_num_key_heads")),
        "head_dim": int(arg("linear_key_head_dim")),
        "num_v_heads": int(arg("linear_num_value_heads")),
        "head_v_dim": int(arg("linear_value_head_dim")),
        "conv_size": int(arg("linear_conv_kernel_dim", 4)),
    }
    if value_heads:
        return dims
    heads, k_heads = dims.pop("num_v_heads"), dims["num_heads"]
    if heads != k_heads:
        raise ValueError(
            f"KDA with {k_heads} key heads and {heads} value heads; Zebra's KDA has one head count"
        )
    return dims


def upcycle_from_attention(note: str, *, value_heads: bool) -> UpcycleAdapter:
    """The attention's heads and head width for keys and values (conv 4; `value_heads`: the mixer has a
    `num_v_heads` too, set to the same count), its Q/K/V/O copied, the delta-rule gates calibrated."""

    def fields(shape: Any, problems: list[str]) -> dict[str, Any]:
        dims = dict(
            num_heads=shape.num_heads, head_dim=shape.head_dim, head_v_dim=shape.head_dim, conv_size=4
        )
        return dims | ({"num_v_heads": shape.num_heads} if value_heads else {})

    return UpcycleAdapter(
        fields=fields,
        copy="zebra.upcycle.recurrent:qkvo_from_attention",
        gates="zebra.upcycle.gates:delta_rule_gates",
        note=note,
    )
