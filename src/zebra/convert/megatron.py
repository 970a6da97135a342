"""Primus / Megatron-LM checkpoints in the `torch` and `torch_dist` formats, read on CPU.

Layouts (a checkpoint root holds `latest_checkpointed_iteration.txt` naming `iter_XXXXXXX/` or `release/`):

    torch       iter_XXXXXXX/mp_rank_00/model_optim_rng.pt: a torch.save dict with "model" (the state dict),
                "args" (argparse.Namespace), "iteration". Read with `torch.load(mmap=True, weights_only=True)`.
    torch_dist  iter_XXXXXXX/{.metadata, __R_T.distcp, common.pt, metadata.json}: a torch.distributed.checkpoint
                directory whose keys are Megatron ShardedTensor keys (no prefix: `decoder.layers.3.mlp...`;
                optimizer state under `optimizer.*`, RNG state and TE extra state as byte objects), plus
                common.pt with the non-tensor state ("args", "iteration"). Fused projections are stored as
                parts (`mixer.in_proj.weight.query` ...) which are concatenated back here.

The architecture comes from the saved arguments (hidden_size, ffn_hidden_size, linear_* GDN/KDA dims,
mamba_* dims, MLA dims, norm_epsilon, untie_embeddings_and_output_weights, ...) and the layer kinds from the
tensors present at each `decoder.layers.{i}`, cross-checked with `hybrid_override_pattern` or
`hybrid_attention_ratio`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

import zebra.convert.megatron_keys as mk
from zebra.convert.keymap import plan_keys
from zebra.convert.tensor_sources import (
    ConvertedSource,
    DCPSource,
    Shapes,
    StateDictSource,
    TensorSource,
    torch_load,
)
from zebra.core.errors import ZebraError
from zebra.mixers import MIXERS, MixerSpec, recurrent_names
from zebra.spec.arch import pattern_from_ratio

_MODEL_PREFIXES = ("embedding.", "decoder.", "output_layer.")
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_MEGATRON_RECURRENT = "M"  # the letter of a recurrent (Mamba) layer in Megatron's hybrid_override_pattern
_UNKNOWN_FIX = "zebra reads Primus GDN / KDA / Mamba2 + MLA hybrids with SwiGLU MLPs (see docs/formats.md)"


def resolve_iteration_dir(path: Path) -> Path:
    """A checkpoint root -> the iteration its latest_checkpointed_iteration.txt names (or its newest iter_*)."""
    path = Path(path)
    tracker = path / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        iterations = sorted(p for p in path.glob("iter_*") if p.is_dir() and p.name[5:].isdigit())
        return iterations[-1] if iterations and path.is_dir() else path
    text = tracker.read_text().strip()
    name = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else None
    if name is None or not (path / name).is_dir():
        raise ZebraError(
            f"{tracker}: names {text!r}, but {path / (name or text)} is missing",
            fix="point at an iter_XXXXXXX directory that exists",
        )
    return path / name


def is_torch_dist(directory: Path) -> bool:
    return (directory / ".metadata").is_file() and (directory / "common.pt").is_file()


def is_torch_format(directory: Path) -> bool:
    return (directory / "mp_rank_00" / "model_optim_rng.pt").is_file()


class _DistPartsSource(TensorSource):
    """A Megatron torch_dist directory with fused tensors reassembled from their ShardedTensorFactory parts."""

    def __init__(self, directory: Path):
        self.dcp = DCPSource(directory, lambda k: k if k.startswith(_MODEL_PREFIXES) else None)
        self.origin = self.dcp.origin
        raw = self.dcp.shapes()
        self._parts: dict[str, list[str]] = {}
        self._meta: Shapes = {}
        grouped: dict[str, dict[str, str]] = {}
        for key in raw:
            base, part = _split_part(key)
            if base is None:
                self._meta[key] = raw[key]
                self._parts[key] = [key]
            else:
                grouped.setdefault(base, {})[part] = key
        for base, parts in grouped.items():
            order = _part_order(base, set(parts), self.origin)
            keys = [parts[p] for p in order]
            shapes = [raw[k][0] for k in keys]
            rows = sum(s[0] for s in shapes)
            self._meta[base] = ((rows, *shapes[0][1:]), raw[keys[0]][1])
            self._parts[base] = keys

    def shapes(self) -> Shapes:
        return dict(self._meta)

    def get(self, name: str) -> torch.Tensor:
        keys = self._parts[name]
        if len(keys) == 1:
            return self.dcp.get(keys[0])
        return torch.cat([self.dcp.get(k) for k in keys], dim=0)


def _split_part(key: str) -> tuple[str | None, str | None]:
    """`...in_proj.weight.query` -> (`...in_proj.weight`, `query`); `...fc1.weight_w` -> (`...fc1.weight`, `_w`)."""
    for suffix in mk.SWIGLU_PARTS:
        if key.endswith(".weight" + suffix):
            return key[: -len(suffix)], suffix
    base, _, part = key.rpartition(".")
    names = {n for order in mk.SPLIT_FACTORIES for n in order}
    if part in names and base.endswith((".weight", ".bias")):
        return base, part
    return None, None


def _part_order(base: str, parts: set[str], origin: str) -> tuple[str, ...]:
    if parts == set(mk.SWIGLU_PARTS):
        return mk.SWIGLU_PARTS
    for order in mk.SPLIT_FACTORIES:
        if set(order) == parts:
            return order
    raise ZebraError(
        f"{origin}: {base} is stored as parts {sorted(parts)}, a split zebra does not know", fix=_UNKNOWN_FIX
    )


def open_megatron(path: Path) -> tuple[TensorSource, dict[str, Any], str, Path]:
    """Open a Megatron checkpoint (root, iteration dir or .pt file).

    Returns:
        (raw source under Megatron names, the non-tensor state with "args" and "iteration", format, directory)
    """
    path = Path(path)
    if path.is_file():
        return (*_open_torch_file(path), "torch", path.parent.parent)
    directory = resolve_iteration_dir(path)
    if is_torch_dist(directory):
        meta = directory / "metadata.json"
        if meta.is_file():
            backend = json.loads(meta.read_text()).get("sharded_backend")
            if backend not in (None, "torch_dist"):
                raise ZebraError(
                    f"{meta}: sharded_backend {backend!r}; zebra reads torch_dist and torch checkpoints",
                    fix="re-save the checkpoint with --ckpt-format torch_dist",
                )
        common = torch_load(directory / "common.pt", mmap=False)
        if not isinstance(common, dict) or "args" not in common:
            raise ZebraError(
                f"{directory}/common.pt: no saved 'args'", fix="use a checkpoint saved by Megatron"
            )
        return _DistPartsSource(directory), common, "torch_dist", directory
    if is_torch_format(directory):
        ranks = sorted(p.name for p in directory.glob("mp_rank_*"))
        if ranks != ["mp_rank_00"]:
            raise ZebraError(
                f"{directory}: a tensor/pipeline-parallel torch-format checkpoint ({', '.join(ranks)})",
                fix="re-save it with --ckpt-format torch_dist (any parallelism), or with TP=PP=1",
            )
        return (*_open_torch_file(directory / "mp_rank_00" / "model_optim_rng.pt"), "torch", directory)
    raise ZebraError(
        f"{path}: not a Megatron checkpoint (no mp_rank_00/model_optim_rng.pt, no .metadata + common.pt)",
        fix="point at the checkpoint root or an iter_XXXXXXX directory",
    )


def _open_torch_file(path: Path) -> tuple[TensorSource, dict[str, Any]]:
    data = torch_load(path)
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ZebraError(f"{path}: no 'model' state dict", fix="use a Megatron model_optim_rng.pt (TP=PP=1)")
    if data.get("args") is None:
        raise ZebraError(f"{path}: no saved 'args'", fix="use a checkpoint saved by Megatron training")
    model = data["model"]
    tensors = {
        k: v for k, v in model.items() if isinstance(v, torch.Tensor) and k.startswith(_MODEL_PREFIXES)
    }
    state = {k: v for k, v in data.items() if k != "model" and k != "optimizer"}
    return StateDictSource(tensors, origin=str(path)), state


def layer_kinds(shapes: Shapes, origin: str) -> str:
    """The pattern string the checkpoint's tensors describe, one letter per `decoder.layers.{i}`."""
    subkeys: dict[int, set[str]] = {}
    for key in shapes:
        m = _LAYER.match(key)
        if m:
            subkeys.setdefault(int(m.group(1)), set()).add(m.group(2))
    if not subkeys:
        raise ZebraError(f"{origin}: no decoder.layers.* tensors", fix=_UNKNOWN_FIX)
    pattern = []
    for i in range(max(subkeys) + 1):
        names = subkeys.get(i, set())
        mixer = next((m for m in MIXERS.values() if m.megatron and m.megatron.detect(names)), None)
        if mixer is None:
            shown = ", ".join(sorted(names)[:4]) or "nothing"
            raise ZebraError(
                f"{origin}: decoder.layers.{i} is an unknown kind of layer (holds {shown})", fix=_UNKNOWN_FIX
            )
        pattern.append(mixer.char)
    return "".join(pattern)


def _arg(args: Any, name: str, origin: str, default: Any = ...) -> Any:
    value = getattr(args, name, None)
    if value is None:
        if default is ...:
            raise ZebraError(
                f"{origin}: saved args have no {name}", fix="use a checkpoint saved by Primus/Megatron"
            )
        return default
    return value


def _slots(pattern: str) -> str:
    """`pattern` as Megatron writes a hybrid stack: every recurrent mixer is a Mamba slot `M` (Primus fills the
    slot with GDN or KDA by its own flags)."""
    return "".join(_MEGATRON_RECURRENT if MIXERS[c].state == "recurrent" else c for c in pattern)


def _check_args_pattern(pattern: str, args: Any, origin: str) -> None:
    slots = _slots(pattern)
    override = getattr(args, "hybrid_override_pattern", None)
    if override:
        expected = override.replace("|", "")
        where = f"hybrid_override_pattern {override!r}"
    elif getattr(args, "hybrid_attention_ratio", None) is not None:
        ratio = float(args.hybrid_attention_ratio)
        num_layers = int(_arg(args, "num_layers", origin))
        expected = _slots(pattern_from_ratio(num_layers, ratio, recurrent_names()[0]))
        where = f"hybrid_attention_ratio {ratio} over {args.num_layers} layers"
    else:
        return
    if expected != slots:
        raise ZebraError(
            f"{origin}: the tensors describe layers {slots!r} but the saved {where} gives {expected!r}",
            fix="the checkpoint does not match its arguments (or uses a layer kind zebra does not know)",
        )


def zebra_config_kwargs(args: Any, shapes: Shapes, pattern: str, origin: str) -> dict[str, Any]:
    """ZebraConfig keyword arguments from Megatron's saved args and the tensor shapes."""
    _check_args_pattern(pattern, args, origin)
    kw = _stack_kwargs(args, shapes, pattern, origin)
    kinds = {MIXERS[c].name: MIXERS[c] for c in pattern}  # the mixers used, by name
    recurrent = [name for name, spec in kinds.items() if spec.state == "recurrent"]
    if len(recurrent) > 1:
        raise ZebraError(f"{origin}: layers mix {sorted(recurrent)} recurrent kinds", fix=_UNKNOWN_FIX)
    if recurrent:
        kw["recurrent_type"] = recurrent[0]
    for spec in kinds.values():
        kw.update(_mixer_kwargs(spec, args, shapes, pattern, origin))
    return kw


def _mixer_kwargs(spec: MixerSpec, args: Any, shapes: Shapes, pattern: str, origin: str) -> dict[str, Any]:
    """One mixer's ZebraConfig keys from its Megatron adapter: the saved args and its first layer's tensors."""
    i = pattern.index(spec.char)

    def first(name: str) -> tuple[int, ...] | None:
        found = shapes.get(f"decoder.layers.{i}.{name}")
        return None if found is None else tuple(found[0])

    try:
        values = spec.megatron.fields(lambda name, default=...: _arg(args, name, origin, default), first)
    except ValueError as error:
        raise ZebraError(f"{origin}: {error}", fix=_UNKNOWN_FIX) from None
    return spec.prefixed(values)


def _stack_kwargs(args: Any, shapes: Shapes, pattern: str, origin: str) -> dict[str, Any]:
    """What every Zebra model has (sizes, norms, embeddings), after checking the args describe a Zebra stack."""
    for name, want in (("normalization", "RMSNorm"), ("swiglu", True)):
        got = getattr(args, name, want)
        if got != want:
            raise ZebraError(
                f"{origin}: saved args say {name}={got!r}; zebra models use {want!r}", fix=_UNKNOWN_FIX
            )
    for flag in ("apply_layernorm_1p", "add_bias_linear"):
        if getattr(args, flag, False):
            raise ZebraError(
                f"{origin}: saved args set {flag}, which zebra models do not have", fix=_UNKNOWN_FIX
            )
    if "embedding.word_embeddings.weight" not in shapes:
        raise ZebraError(f"{origin}: no embedding.word_embeddings.weight", fix="use a complete checkpoint")
    hidden = int(_arg(args, "hidden_size", origin))
    max_pos = int(getattr(args, "max_position_embeddings", None) or _arg(args, "seq_length", origin))
    return {
        "vocab_size": shapes["embedding.word_embeddings.weight"][0][0],
        "hidden_size": hidden,
        "intermediate_size": int(_arg(args, "ffn_hidden_size", origin)),
        "num_hidden_layers": len(pattern),
        "layer_pattern": pattern,
        "hybrid_attention_ratio": pattern.count("*") / max(1, len(pattern) // 2),
        "rms_norm_eps": float(_arg(args, "norm_epsilon", origin, 1e-5)),
        "tie_word_embeddings": not bool(getattr(args, "untie_embeddings_and_output_weights", False)),
        "max_position_embeddings": max_pos,
    }


def split_dims(kw: dict[str, Any]) -> dict[str, int]:
    """Sizes the key tables' `Split` / `Reshape` entries refer to."""
    dims: dict[str, int] = {}
    cfg = SimpleNamespace(**kw)
    for spec in {MIXERS[c].name: MIXERS[c] for c in kw["layer_pattern"]}.values():
        dims.update(spec.megatron.dims(cfg))
    return dims


def _fold_double_latent_norms(raw: TensorSource, shapes: Shapes, notes: list[str]) -> Shapes:
    """Primus' newest TE MLA spec applies `q_layernorm` and then `linear_q_up_proj`'s own norm (and the same for
    kv). Zebra has one norm there: when the first is all ones (as initialised) the pair is one RMSNorm up to
    epsilon and the first is dropped; otherwise the model cannot be represented and conversion stops."""
    out = dict(shapes)
    for key in shapes:
        for first, second in (
            ("self_attention.q_layernorm.weight", "self_attention.linear_q_up_proj.layer_norm_weight"),
            ("self_attention.kv_layernorm.weight", "self_attention.linear_kv_up_proj.layer_norm_weight"),
        ):
            if not key.endswith("." + first):
                continue
            other = key[: -len(first)] + second
            if other not in shapes:
                continue
            if not bool(torch.all(raw.get(key) == 1)):
                raise ZebraError(
                    f"{raw.origin}: {key} and {other} are two trained RMSNorms in a row; Zebra's MLA has one",
                    fix="this Primus layer spec cannot be represented exactly; convert a checkpoint trained "
                    "with one latent norm (q_layernorm/kv_layernorm = IdentityOp or TENorm, not both)",
                )
            del out[key]
            notes.append(f"{key} is all ones: folded into {other} (two RMSNorms in a row, equal up to eps)")
    return out


def _check_pre_norms(pattern: str, shapes: Shapes, origin: str) -> None:
    """Every Zebra sublayer is pre-norm; a Megatron layer built without one cannot be represented."""
    for i, char in enumerate(pattern):
        norms = MIXERS[char].megatron.pre_norms
        if not any(f"decoder.layers.{i}.{name}" in shapes for name in norms):
            raise ZebraError(
                f"{origin}: decoder.layers.{i} has no pre-norm ({' or '.join(norms)}); every Zebra "
                "sublayer normalises its input",
                fix="this layer spec (e.g. Primus' mamba_hybrid_stack_spec_no_te) has no Zebra equivalent",
            )


def read_megatron(path: Path) -> tuple[dict[str, Any], TensorSource, dict[str, Any]]:
    """Open a Primus/Megatron checkpoint as Zebra config kwargs + a source under Zebra names + info.

    Returns:
        (config kwargs, tensor source with Zebra names, info dict with `format`, `iteration`, `tokenizer`,
        `notes`, `directory`).
    """
    raw, state, fmt, directory = open_megatron(path)
    args = state["args"]
    origin = raw.origin
    shapes = raw.shapes()
    pattern = layer_kinds(shapes, origin)
    kw = zebra_config_kwargs(args, shapes, pattern, origin)
    _check_pre_norms(pattern, shapes, origin)
    notes: list[str] = []
    if "*" in pattern:
        shapes = _fold_double_latent_norms(raw, shapes, notes)
    if kw["tie_word_embeddings"] and "output_layer.weight" in shapes:
        del shapes["output_layer.weight"]  # Megatron keeps a copy only when pipeline stages split the two
    elif not kw["tie_word_embeddings"] and "output_layer.weight" not in shapes:
        raise ZebraError(
            f"{origin}: untie_embeddings_and_output_weights is set but output_layer.weight is missing",
            fix="use a complete checkpoint",
        )

    def keymap_for(key: str):
        m = _LAYER.match(key)
        if m and int(m.group(1)) < len(pattern):
            return mk.keymap_of(MIXERS[pattern[int(m.group(1))]])
        return mk.GLOBAL

    pieces = plan_keys(keymap_for, shapes, split_dims(kw), origin=origin, fix=_UNKNOWN_FIX)
    tokenizer = (
        getattr(args, "tokenizer_model", None)
        if getattr(args, "tokenizer_type", "") == "HuggingFaceTokenizer"
        else None
    )
    info = {
        "format": f"megatron-{fmt}",
        "iteration": state.get("iteration"),
        "tokenizer": tokenizer,
        "notes": notes,
        "directory": str(directory),
    }
    return kw, ConvertedSource(raw, pieces), info
