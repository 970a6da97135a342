"""Wrap a single-device model for training, torchtitan order: model converters (fused projections, float8) ->
activation checkpointing -> compile -> data parallel.

Data parallelism: FSDP2 (`fully_shard` on every sublayer, then the root; bf16 parameters for compute, fp32
gradient reduction, fp32 master weights) for large models, DDP for small ones, nothing for one rank.
Every wrapper keeps ZebraForCausalLM's parameter names in `get_model_state_dict`, so checkpoints read the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zebra.core.errors import ZebraError
from zebra.mixers import MIXERS

if TYPE_CHECKING:
    import torch

    from zebra.recipes import TrainSpec
    from zebra.train.dist import DistEnv

FSDP_MIN_PARAMS = 1_000_000_000  # `train.parallel: auto` shards models from this size on
FLOAT8_MIN_DIM = 128  # Linear layers narrower than this stay in bf16: too small for FP8 to pay for its casts


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


def sublayer_letter(layer: torch.nn.Module) -> str | None:
    """The pattern character of a (possibly checkpoint-wrapped) ZebraSublayer; None for other models' layers."""
    return getattr(getattr(layer, "_checkpoint_wrapped_module", layer), "char", None)


def chosen_letters(pattern: str, which: str, key: str) -> set[str]:
    """The sublayer kinds (pattern letters) of `pattern` a lever applies to: all of them for `which == "all"`,
    else those in `which` (e.g. "-" for the MLPs); a ZebraError naming the recipe key `key` for anything else."""
    if which != "all" and (not which or set(which) - set(MIXERS)):
        raise ZebraError(
            f"{key}={which!r} is neither 'all' nor letters of {''.join(MIXERS)!r}",
            fix=f"set it to all, or to the sublayer kinds it applies to, e.g. --set {key}='*-'",
        )
    return set(pattern) if which == "all" else set(pattern) & set(which)


def chosen_sublayers(model: torch.nn.Module, which: str, key: str) -> list[torch.nn.Module]:
    """The sublayers a lever applies to (`chosen_letters`): every one for `which == "all"`, else those whose
    pattern character is in `which`."""
    layers = sublayers(model)
    chosen = chosen_letters("".join(sublayer_letter(layer) or "" for layer in layers), which, key)
    return [layer for layer in layers if which == "all" or sublayer_letter(layer) in chosen]


def apply_compile(model: torch.nn.Module, which: str = "all") -> None:
    """torch.compile each sublayer in place (parameter names unchanged): every one, or those whose pattern
    character is in `which` (`train.compile_sublayers`, e.g. "-" for the MLPs only: regional compilation)."""
    for layer in chosen_sublayers(model, which, "train.compile_sublayers"):
        layer.compile()


def apply_fused_projections(model: torch.nn.Module) -> int:
    """Make every module that stacks its input projections (`fuse_projections`, see
    `zebra.models.layers.packed.project`) run them as one GEMM in training; returns how many were switched."""
    from zebra.models.layers.packed import set_flag

    return set_flag(model, "fuse_projections")


def float8_eligible(module: torch.nn.Module, fqn: str) -> bool:
    """Which Linear layers `apply_float8` converts: both dimensions multiples of 16 (FP8 GEMM tiles) and at least
    FLOAT8_MIN_DIM, and not the output head (the loss reads its weight directly)."""
    import torch

    if not isinstance(module, torch.nn.Linear) or fqn.endswith("lm_head"):
        return False
    dims = (module.in_features, module.out_features)
    return all(d % 16 == 0 and d >= FLOAT8_MIN_DIM for d in dims)


def eager_float8_note(pattern: str, train: TrainSpec) -> str | None:
    """A warning when `train.fp8` converts sublayers of the layer `pattern` that `train.compile` leaves eager:
    torchao's casts then run as kernels of their own (FP8 was slower than bf16 so: docs/benchmarks.md, FP8).
    None when every float8 sublayer is compiled, or fp8 is off."""
    if not train.fp8:
        return None
    converted = chosen_letters(pattern, train.fp8_sublayers, "train.fp8_sublayers")
    compiled = (
        chosen_letters(pattern, train.compile_sublayers, "train.compile_sublayers")
        if train.compile
        else set()
    )
    if not (eager := converted - compiled):
        return None
    fix = f"--set train.compile=true --set train.compile_sublayers={''.join(sorted(compiled | eager))}"
    if compiled:
        fix += f", or float8 only where compiled: --set train.fp8_sublayers={''.join(sorted(compiled))}"
    return (
        f"train.fp8: the float8 layers of the {''.join(sorted(eager))!r} sublayers run eager, where torchao's casts "
        f"are kernels of their own (FP8 ran 40% slower than bf16 so); compile them: {fix}"
    )


FLOAT8_GPUS = "NVIDIA sm89+ (Ada, Hopper, Blackwell) or AMD MI300/MI350"


def check_float8_device(device: torch.device) -> None:
    """Refuse `train.fp8` on a GPU without float8 GEMMs, in one line before any layer is converted (torch's
    `_scaled_mm` would fail in the first step). CPUs pass: torch's CPU `_scaled_mm` runs it, slowly (tests)."""
    import torch

    if device.type != "cuda":
        return
    from zebra.core.device import gpu_arch

    arch = gpu_arch(device)
    ok = (
        arch in ("gfx942", "gfx950")
        if torch.version.hip
        else torch.cuda.get_device_capability(device) >= (8, 9)
    )
    if not ok:
        raise ZebraError(
            f"train.fp8: {torch.cuda.get_device_name(device)} ({arch}) has no float8 GEMMs",
            fix=f"drop train.fp8; it needs {FLOAT8_GPUS}",
        )


def apply_float8(model: torch.nn.Module, which: str = "-", recipe: str = "tensorwise") -> None:
    """torchao float8 training on the `float8_eligible` Linear layers of every sublayer, or of those whose pattern
    character is in `which` (`train.fp8_sublayers`, e.g. "-" for the MLPs, whose GEMMs are the widest), in place;
    parameter names unchanged. `recipe` (`train.fp8_recipe`) is torchao's: "tensorwise" (one scale per tensor:
    the cheapest casts, faster than rowwise in docs/benchmarks.md's FP8 runs), "rowwise" (a scale per row) or
    "rowwise_with_gw_hp" (rowwise, the weight gradient in bf16).
    Projections fused by `fuse_projections` run as one bf16 GEMM instead."""
    layers = chosen_sublayers(model, which, "train.fp8_sublayers")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as error:
        raise ZebraError(
            f"train.fp8 needs torchao ({error})", fix="pip install 'zebra-llama[fp8]', or drop train.fp8"
        ) from None
    config = Float8LinearConfig.from_recipe_name(recipe)
    for layer in layers:
        convert_to_float8_training(layer, config=config, module_filter_fn=float8_eligible)


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
    model: torch.nn.Module, env: DistEnv, *, mode: str, bf16: bool, train: TrainSpec
) -> torch.nn.Module:
    """The model ready for training on `env` (`mode` from `choose_parallel`) with `train`'s levers (fused
    projections, float8, activation checkpointing, compile); returns the wrapper to call."""
    if train.fuse_projections:
        apply_fused_projections(model)
    if train.fp8:
        check_float8_device(env.device)
        apply_float8(model, train.fp8_sublayers, train.fp8_recipe)
    if train.activation_checkpointing:
        apply_activation_checkpointing(model)
    if train.compile:
        apply_compile(model, train.compile_sublayers)
    if mode == "fsdp":
        apply_fsdp(model, env, bf16=bf16)
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [env.device.index] if env.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    return model
