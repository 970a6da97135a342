"""The mixer spec: what one sublayer kind is, for every part of zebra, in one torch-free record.

`MIXERS` maps each pattern character to a `MixerSpec`; each built-in mixer declares its spec in its own module
(`zebra.mixers.<name>`), and every part of zebra that depends on the kind of a sublayer reads it from there:

- the model builds each sublayer from `layer`, a dotted class path imported on first use, with the keyword
  arguments `layer_kwargs(cfg, layer_idx)` (this package imports nothing heavy: `zebra recipes list` reads it, and the HF
  export copies it);
- the decode cache (`ZebraCache`) gives a sublayer a slot of the kind `state` with the shapes `state_shapes`;
- `zebra.spec.arch` counts `params` and the state bytes, and places the `recurrent_type` mixer by the ratio;
- `ZebraConfig` takes the keys `<config_prefix>_<field>` of `fields`, the recipe schema makes the section
  `model.<section>` from the same `fields` (name, default, doc, range), and both run `check` when a pattern
  uses the mixer;
- `zebra recipes list` prints `label`, the model card `title` and `summary`;
- the optional adapters: `fla` (FLA's whole-model class, `zebra convert` both ways, `zebra bench train
  --against fla`), `megatron` (Primus checkpoints: the layer kind, the saved arguments, the key table),
  `upcycle` (`zebra upcycle`: the mixer's sizes from a teacher's attention and the weight copy), `native`
  (`zebra convert --to <transformers class>`) and `gguf` (`zebra convert --to gguf`: llama.cpp's tensors).

Every function of a spec reads a *flat* configuration: any object with the attributes of `ZebraConfig` (the config
itself, or `Recipe.model.flat()` through `zebra.spec.arch.as_config`). Adding a mixer: docs/models.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zebra.core.errors import ZebraError

MLP = "-"  # the SwiGLU MLP character: every other sublayer must be followed by one
ATTENTION = "*"  # the MLA character: what `hybrid_attention_ratio` places between the recurrent mixers

Shapes = dict[str, tuple[int, ...]]
# The model-wide constructor arguments a layer may take (`MixerSpec.layer_args`), by their ZebraConfig key.
LAYER_ARGS = {"hidden_size": "hidden_size", "norm_eps": "rms_norm_eps", "backend": "kernel_backend"}


@dataclass(frozen=True)
class ConfigField:
    """One setting of a mixer: its recipe key `model.<section>.<name>` and its `ZebraConfig` key
    `<config_prefix>_<name>` or `key` (one default, one doc, one range for both).

    Attributes:
        name: the field name ("num_heads").
        default: its default (its type is the field's type: int, float or bool).
        doc: one line for `docs/recipes.md` and `zebra recipes show`.
        min, max: the allowed range of a number (None: unbounded).
        key: its `ZebraConfig` key where that is not `<config_prefix>_<name>` (MLA's `num_heads` is HF's
            `num_attention_heads`); a dotted key is an entry of a dict-valued key (`rope_scaling.factor`).
    """

    name: str
    default: Any
    doc: str
    min: float | None = None
    max: float | None = None
    key: str = ""


@dataclass(frozen=True)
class FLAAdapter:
    """A mixer's FLA whole-model class: a pure stack of this mixer and SwiGLU MLPs (`zebra.convert.fla_format`).

    Attributes:
        model_type: FLA's `model_type` ("gated_deltanet").
        architecture: its causal-LM class in `fla.models` ("GatedDeltaNetForCausalLM").
        config_class: its config class in `fla.models` ("GatedDeltaNetConfig").
        layer_class: its mixer layer in `fla.layers` ("GatedDeltaNet"; the layer tests compare with it).
        defaults: FLA 0.6.0's defaults of the config fields `to_zebra` reads beyond the common ones.
        to_zebra: `(FLA config dict, with "_source" = its path) -> {field: value}`, the mixer's own fields
            (unprefixed); a ZebraError for a setting Zebra cannot represent.
        from_zebra: `cfg -> {FLA config key: value}`, the mixer's part of FLA's config.json.
    """

    model_type: str
    architecture: str
    config_class: str
    layer_class: str
    defaults: dict[str, Any]
    to_zebra: Callable[[dict[str, Any]], dict[str, Any]]
    from_zebra: Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Split:
    """A key-table entry (`zebra.convert.keymap`): cut a fused tensor along `dim` into `parts`,
    `(target_template, size_name)` in order."""

    dim: int
    parts: tuple[tuple[str, str], ...]

    def __init__(self, dim: int, *parts: tuple[str, str]):
        object.__setattr__(self, "dim", dim)
        object.__setattr__(self, "parts", tuple(parts))


@dataclass(frozen=True)
class Reshape:
    """A key-table entry (`zebra.convert.keymap`): same values, new shape; `shape` is a tuple of size names
    (entries of `dims`) or ints."""

    target: str
    shape: tuple[str | int, ...]


# A Megatron key table's templates (`MegatronAdapter.keys`): Megatron numbers sublayers as Zebra does.
MEGATRON_LAYER = "decoder.layers.{i}."
ZEBRA_LAYER = "model.layers.{i}."
# Where a recurrent layer keeps its pre-norm: TE-fused into in_proj, or its own module (the local spec).
RECURRENT_PRE_NORM = {
    MEGATRON_LAYER + "mixer.in_proj.layer_norm_weight": ZEBRA_LAYER + "norm.weight",
    MEGATRON_LAYER + "norm.weight": ZEBRA_LAYER + "norm.weight",
}


@dataclass(frozen=True)
class MegatronAdapter:
    """How a Primus / Megatron-LM checkpoint holds the mixer (`zebra.convert.megatron`).

    Attributes:
        detect: `(tensor names under decoder.layers.{i}) -> bool`, whether that layer is this mixer (tried in
            registry order; the names are relative, `mixer.in_proj.weight`).
        fields: `(arg, first) -> {field: value}`: its fields from `arg(name, default=...)` (a saved argument;
            no default: required) and `first(name) -> shape or None` (a tensor of the first such layer, `mixer.D`).
        keys: the table `{Megatron key: Zebra key, Split, Reshape or None (dropped)}` of one such layer
            (`MEGATRON_LAYER` / `ZEBRA_LAYER` templates; `zebra.convert.keymap`).
        pre_norms: where the layer keeps its pre-norm (TE-fused, or its own module): one must be present.
        dims: `cfg -> {size name: int}`, the sizes its table's `Split` / `Reshape` entries name.
        parts: the part names a torch_dist checkpoint stores its fused tensors as (`in_proj.weight.query`, ...,
            through Megatron's ShardedTensorFactory), in row order, one tuple per fused module.
    """

    detect: Callable[[set[str]], bool]
    fields: Callable[[Callable[..., Any], Callable[[str], tuple[int, ...] | None]], dict[str, Any]]
    keys: dict[str, Any]
    pre_norms: tuple[str, ...] = ("mixer.in_proj.layer_norm_weight", "norm.weight")
    dims: Callable[[Any], dict[str, int]] = lambda cfg: {}
    parts: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class UpcycleAdapter:
    """How a teacher's attention becomes this mixer (`zebra upcycle`).

    Attributes:
        fields: `(teacher shape, problems) -> {field: value}`, its sizes from the teacher's attention
            (`zebra.upcycle.teachers.teacher.TeacherShape`: num_heads, num_kv_heads, head_dim, hidden_size); what cannot
            be built is appended to `problems`.
        copy: `"module:function"`, the weight copy `(TeacherAttention, init, prefix, dtype) -> {name: (tensor,
            origin)}` (`zebra.upcycle.recurrent`).
        aliases: other `--mixer` names for it ("mamba").
        gates: `"module:function"`, its data-driven gate init for `zebra upcycle --calibrate`
            (`(mixer, distance [H], entropy [H], mean input [D]) -> {what: per-head values}`,
            `zebra.upcycle.gates`); None: the gates keep the mixer's own initialisation.
        note: a line `zebra upcycle` prints about this route (what it follows, what is published).
    """

    fields: Callable[[Any, list[str]], dict[str, Any]]
    copy: str
    aliases: tuple[str, ...] = ()
    gates: str | None = None
    note: str = ""


@dataclass(frozen=True)
class NativeTensor:
    """One tensor of a transformers-native checkpoint: `name`, the Zebra tensors it is made of, and how
    (`build(parts)`: concatenation, row permutation or reshape alone, torch imported inside)."""

    name: str
    sources: tuple[str, ...]
    build: Callable[[list[Any]], Any] = staticmethod(lambda parts: parts[0])  # type: ignore[assignment]


@dataclass(frozen=True)
class Blocker:
    """A setting with no exact native equivalent: the recipe field, its value, and the value that fits."""

    field: str
    value: Any
    fits: Any
    why: str


@dataclass(frozen=True)
class NativeAdapter:
    """How the mixer becomes the mixer (or MLP) of a transformers class's decoder layer (`zebra.convert.native`,
    whose `TARGETS` say which class holds which mixer, in which module).

    Attributes:
        tensors: `(cfg, zebra prefix, native prefix, target name) -> [NativeTensor]`; the prefixes end in a dot.
        blockers: `cfg -> [Blocker]`: what stops an exact export.
        config: `cfg -> {config.json field: value}`, the mixer's sizes in the native config (a dict value is
            merged into the target's own dict of that name); written for every target that holds the mixer.
        servable: the recipe that exports this mixer, named when a model's mix of mixers has no native class.
    """

    tensors: Callable[[Any, str, str, str], list[NativeTensor]]
    blockers: Callable[[Any], list[Blocker]] = lambda cfg: []
    config: Callable[[Any], dict[str, Any]] = lambda cfg: {}
    servable: str = ""


@dataclass(frozen=True)
class GgufAdapter:
    """How the mixer (or MLP) becomes its part of a llama.cpp GGUF block (`zebra.convert.gguf_maps`, whose
    `GGUF_ARCHS` say which llama.cpp architecture holds which mixers, and write its metadata).

    Attributes:
        tensors: `(cfg, zebra prefix, block prefix) -> [NativeTensor]`, the GGUF tensors (llama.cpp's names,
            `blk.{i}.ssm_a`) and how each is built; the prefixes end in a dot.
        blockers: `cfg -> [Blocker]`: the settings llama.cpp cannot run exactly.
    """

    tensors: Callable[[Any, str, str], list[NativeTensor]]
    blockers: Callable[[Any], list[Blocker]] = lambda cfg: []


def weights(prefix: str, *modules: str) -> tuple[str, ...]:
    """The weight names `<prefix><module>.weight` of `modules` (a native adapter's sources)."""
    return tuple(f"{prefix}{m}.weight" for m in modules)


def concat(parts: list[Any], dim: int = 0) -> Any:
    """The tensors `parts` joined along `dim` (`torch.cat`; with the default, a `NativeTensor.build`)."""
    import torch

    return torch.cat(parts, dim=dim)


def neg_exp(parts: list[Any]) -> Any:
    """`-exp(A_log)` of the first tensor, computed in float64 and rounded once (llama.cpp stores the decay
    rates `A` themselves; a `NativeTensor.build`)."""
    import torch

    return -torch.exp(parts[0].double()).to(parts[0].dtype)


def column(build: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """`build`, its result made a column: `[H] -> [H, 1]` (llama.cpp's `{1, H}`)."""
    return lambda parts: build(parts).reshape(-1, 1)


def eps_blocker(cfg: Any, eps: float, why: str) -> list[Blocker]:
    """A `Blocker` of `model.norm_eps` unless the model's norm epsilon is `eps`."""
    return [] if cfg.rms_norm_eps == eps else [Blocker("model.norm_eps", cfg.rms_norm_eps, eps, why)]


@dataclass(frozen=True)
class MixerSpec:
    """One sublayer kind.

    Attributes:
        char: its character in a layer pattern ("M").
        name: its name in `recurrent_type` and in `zebra.spec.arch.param_count(...).by_kind` ("mamba2").
        label: short display name (`zebra recipes list`: "Mamba2", "GDN").
        title: long display name (model card: "Gated DeltaNet").
        layer: dotted path of the `nn.Module` class; the class has `reset_parameters()` and the sublayer call
            signature (docs/models.md). Imported when a model is built, with `layer_kwargs(cfg, layer_idx)`.
        params: `cfg -> int`, the parameters of one such sublayer, its pre-norm left out.
        layer_args: the model-wide constructor arguments the layer takes besides its fields (a subset of
            `LAYER_ARGS`: hidden_size, norm_eps, layer_idx, backend); None: the class builds itself with
            `from_config(config, layer_idx)`.
        state: the kind of its decode-cache slot: "recurrent" (fixed-size `recurrent` and `conv` tensors:
            float32, and the model dtype for a static cache's `conv`; such a mixer can be the `recurrent_type`
            that `hybrid_attention_ratio` places), "latent" (tensors that grow by one row per token, in the model
            dtype) or None (no state).
        state_shapes: `(cfg, batch_size, max_length) -> {tensor name: shape}` of the slot (a static cache
            allocates these; names are the slot's fields: `recurrent`, `conv` or `latent`, `k_rope`).
        config_prefix: its `ZebraConfig` keys are `<config_prefix>_<field>`; "" when they are plain HF names.
        fields: its settings (`ConfigField`): the `ZebraConfig` keys and the recipe section's fields.
        config_defaults: `{field: default}` of those keys; filled from `fields` when they are given.
        section: the recipe section `model.<section>` holding its fields.
        section_doc: the section's one-line doc (`docs/recipes.md`).
        check: `cfg -> [(field, problem)]`, the rules between its sizes that one field's range cannot express;
            `field` is named within `section`; run only when the pattern uses the mixer.
        summary: `cfg -> str`, its sizes in one line (the model card).
        fla, megatron, upcycle, native, gguf: the optional adapters (None: that route does not take this mixer).
    """

    char: str
    name: str
    label: str
    title: str
    layer: str
    params: Callable[[Any], int]
    layer_args: tuple[str, ...] | None = None
    state: str | None = None
    state_shapes: Callable[[Any, int, int], Shapes] = lambda cfg, batch_size, max_length: {}
    config_prefix: str = ""
    fields: tuple[ConfigField, ...] = ()
    config_defaults: dict[str, Any] = field(default_factory=dict)
    section: str | None = None
    section_doc: str = ""
    check: Callable[[Any], list[tuple[str, str]]] = lambda cfg: []
    summary: Callable[[Any], str] = lambda cfg: ""
    fla: FLAAdapter | None = None
    megatron: MegatronAdapter | None = None
    upcycle: UpcycleAdapter | None = None
    native: NativeAdapter | None = None
    gguf: GgufAdapter | None = None

    def __post_init__(self) -> None:
        if self.fields and not self.config_defaults:
            object.__setattr__(self, "config_defaults", {f.name: f.default for f in self.fields})

    def config_key(self, field_name: str) -> str:
        """The `ZebraConfig` key of one of its fields (`num_heads` -> `gdn_num_heads`; MLA's `num_heads` ->
        `num_attention_heads`, its field's `key`)."""
        declared = next((f.key for f in self.fields if f.name == field_name and f.key), "")
        return declared or (f"{self.config_prefix}_{field_name}" if self.config_prefix else field_name)

    def config_kwargs(self) -> dict[str, Any]:
        """`{ZebraConfig key: default}` of its keys (an entry of a dict-valued key left out)."""
        keys = {k: self.config_key(k) for k in self.config_defaults}
        return {keys[k]: v for k, v in self.config_defaults.items() if "." not in keys[k]}

    def layer_kwargs(self, cfg: Any, layer_idx: int) -> dict[str, Any]:
        """The layer's constructor arguments: `layer_args` and every field, by name."""
        common = {"layer_idx": layer_idx, **{k: getattr(cfg, v) for k, v in LAYER_ARGS.items()}}
        return {**{a: common[a] for a in self.layer_args or ()}, **self.values(cfg)}

    def values(self, cfg: Any) -> dict[str, Any]:
        """`{field: value}` of its fields that are keys of their own in a flat configuration."""
        return {
            k: getattr(cfg, self.config_key(k)) for k in self.config_defaults if "." not in self.config_key(k)
        }

    def prefixed(self, values: dict[str, Any]) -> dict[str, Any]:
        """`{ZebraConfig key: value}` of `{field: value}`."""
        return {self.config_key(k): v for k, v in values.items()}


MIXERS: dict[str, MixerSpec] = {}


def register_mixer(spec: MixerSpec) -> MixerSpec:
    """Add a sublayer kind to the table (at import of a module that defines one); return it.

    Raises ValueError when the character is not a single unused printable character or the name is taken.
    """
    if len(spec.char) != 1 or not spec.char.isprintable() or spec.char.isspace():
        raise ValueError(f"mixer {spec.name!r}: pattern character {spec.char!r} is not one visible character")
    if spec.char in MIXERS:
        raise ValueError(
            f"mixer {spec.name!r}: pattern character {spec.char!r} is taken by {MIXERS[spec.char].name!r}"
        )
    if any(s.name == spec.name for s in MIXERS.values()):
        raise ValueError(f"mixer name {spec.name!r} is already registered")
    if spec.state not in ("recurrent", "latent", None):
        raise ValueError(f"mixer {spec.name!r}: state {spec.state!r} is not 'recurrent', 'latent' or None")
    MIXERS[spec.char] = spec
    return spec


def mixer_spec(char: str) -> MixerSpec:
    """The spec of a pattern character; ValueError for an unknown one."""
    try:
        return MIXERS[char]
    except KeyError:
        raise ValueError(f"unknown sublayer character {char!r} (known: {' '.join(MIXERS)})") from None


def keeps_tokens(pattern: str) -> bool:
    """Whether a layer pattern has a sublayer that keeps state per token ("latent": MLA's keys, at RoPE
    positions): its cache grows with the sequence and its positions are bounded by the model's context."""
    return any(mixer_spec(char).state == "latent" for char in pattern)


def recurrent_names() -> tuple[str, ...]:
    """Names a `recurrent_type` may take: the mixers with a recurrent cache slot, in table order."""
    return tuple(s.name for s in MIXERS.values() if s.state == "recurrent")


def recurrent_spec(name: str) -> MixerSpec:
    """The recurrent mixer called `name`; ValueError naming the choices otherwise."""
    for spec in MIXERS.values():
        if spec.name == name and spec.state == "recurrent":
            return spec
    raise ValueError(f"recurrent type {name!r} is not one of {sorted(recurrent_names())}")


def mixer_named(name: str) -> MixerSpec:
    """The spec called `name`; ValueError naming the registered names otherwise."""
    for spec in MIXERS.values():
        if spec.name == name:
            return spec
    raise ValueError(f"mixer {name!r} is not one of {sorted(s.name for s in MIXERS.values())}")


def resolve(path: str) -> Any:
    """The object a `"module:name"` path names (the adapters' code that lives above this package), imported on
    first use."""
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def conv_check(width: int) -> list[tuple[str, str]]:
    """The rule of a short-convolution width (`check` of the mixers that have one)."""
    return [] if width >= 2 else [("conv_size", f"{width} is below 2 (expected a convolution width >= 2)")]


# Upper bounds of a mixer's sizes in a recipe (`ConfigField.max`): far above any real model, low enough that a
# typo (an extra zero or ten) is refused when the recipe loads (as `zebra.recipes.schema`'s own bounds).
HEADS = 4096
HEAD_DIM = 65_536
RANK = 65_536  # a latent rank
POSITIONS = 1 << 24  # tokens in a sequence


def fla_value_dim(cfg: dict[str, Any]) -> int:
    """FLA's value channels per head, `head_dim * expand_v`, from an FLA config dict (a one-line error naming
    its `_source` when that is not an integer)."""
    head_v = cfg["head_dim"] * cfg["expand_v"]
    if abs(head_v - round(head_v)) > 1e-9:
        raise ZebraError(
            f"{cfg['_source']}: head_dim * expand_v = {head_v} is not an integer", fix="fix config.json"
        )
    return round(head_v)


def fla_refuse(cfg: dict[str, Any], key: str, allowed: tuple[Any, ...], why: str) -> None:
    """A ZebraError naming the FLA config's `key` when its value is not one of `allowed`."""
    value = cfg.get(key)
    if value not in allowed:
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as config.json writes it
        raise ZebraError(f"{cfg['_source']}: {key}={shown} has no Zebra equivalent", fix=why)
