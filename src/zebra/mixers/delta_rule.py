"""What the two delta-rule mixers (GDN `zebra.mixers.gdn`, KDA `zebra.mixers.kda`) read and build alike: their
dimensions from an FLA config or a Megatron checkpoint's args, and their upcycling from attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zebra.mixers.spec import UpcycleAdapter, fla_value_dim


def fla_dims(cfg: dict[str, Any]) -> dict[str, Any]:
    """Heads, key / value channels per head and conv width from an FLA config dict (`FLAAdapter.to_zebra`)."""
    return {
        "num_heads": cfg["num_heads"],
        "head_dim": cfg["head_dim"],
        "head_v_dim": fla_value_dim(cfg),
        "conv_size": cfg["conv_size"],
    }


def megatron_dims(arg: Callable[..., Any]) -> dict[str, int]:
    """Key heads, value heads, channels per head and conv width from a Megatron checkpoint's `linear_*` args
    (`arg(name, default)`, `MegatronAdapter.fields`)."""
    return {
        "num_heads": int(arg("linear_num_key_heads")),
        "head_dim": int(arg("linear_key_head_dim")),
        "num_v_heads": int(arg("linear_num_value_heads")),
        "head_v_dim": int(arg("linear_value_head_dim")),
        "conv_size": int(arg("linear_conv_kernel_dim", 4)),
    }


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
