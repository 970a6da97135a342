"""Wrap a single-device model for training, torchtitan order: activation checkpointing -> compile -> data parallel.

Data parallelism: FSDP2 (`fully_shard` on every sublayer, then the root; bf16 parameters for compute, fp32
gradient reduction, fp32 master weights) for large models, DDP for small ones, nothing for one rank.
Every wrapper keeps ZebraForCausalLM's parameter names in `get_model_state_dict`, so checkpoints read the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zebra.errors import ZebraError

if TYPE_CHECKING:
    import torch

    from zebra.train.dist import DistEnv

FSDP_MIN_PARAMS = 1_000_000_000  # `train.parallel: auto` shards models from this size on


def choose_parallel(requested: str, num_params: int, world_size: int) -> str:
    """`none` for one rank; otherwise `fsdp` or `ddp` (`auto`: FSDP2 from 1B parameters on)."""
    if world_size == 1:
        return "none"
    if requested == "auto":
        return "fsdp" if num_params >= FSDP_MIN_PARAMS else "ddp"
    return requested


def sublayers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The sublayer stack (`model.layers` of a ZebraForCausalLM; FLA models use the same name)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ZebraError(f"{type(model).__name__} has no model.layers to wrap per sublayer")
    return layers


def apply_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute every sublayer's activations in backward instead of keeping them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = sublayers(model)
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)


def apply_compile(model: torch.nn.Module) -> None:
    """torch.compile each sublayer in place (parameter names unchanged)."""
    for layer in sublayers(model):
        layer.compile()


def apply_fsdp(model: torch.nn.Module, env: DistEnv, *, bf16: bool) -> None:
    """FSDP2: shard every sublayer, then the root (embeddings, final norm, head)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(env.device.type, (env.world_size,))
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else torch.float32, reduce_dtype=torch.float32
    )
    layers = sublayers(model)
    for i, layer in enumerate(layers):
        # the last sublayer's parameters are gathered again at once by backward: keep them
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def parallelize(
    model: torch.nn.Module,
    env: DistEnv,
    *,
    mode: str,
    bf16: bool,
    activation_checkpointing: bool,
    compile: bool,
) -> torch.nn.Module:
    """The model ready for training on `env` (`mode` from `choose_parallel`); returns the wrapper to call."""
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    if compile:
        apply_compile(model)
    if mode == "fsdp":
        apply_fsdp(model, env, bf16=bf16)
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [env.device.index] if env.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    return model
