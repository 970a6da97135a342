"""The student's shape: everything from the teacher, except where MLA goes and the ranks (options or a recipe).

Dense layer i becomes sublayers (2i, 2i+1) = (mixer, MLP); the mixer is MLA at the chosen layers and the
recurrent kind elsewhere. Mixer shapes follow from the teacher's attention (H query heads, Hkv KV heads, head
dim Dh, width D):

    MLA     H heads, v_head_dim = Dh, qk_nope + qk_rope = Dh; ranks r_q, r_kv (defaults: the published 1B ranks
            1344 / 128 at width 2048, scaled with D, multiples of 8, at most the matrix rank), rope dim Dh / 2
    other   the recurrent mixer's upcycle adapter (`zebra.mixers.<name>`, `MixerSpec.upcycle.fields`): Mamba2
            with one B/C group per query head, GDN / KDA / GLA with H heads of Dh key and Dh value channels
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from zebra.core.errors import ZebraError
from zebra.mixers import ATTENTION, MIXERS, MLP, MixerSpec, recurrent_spec
from zebra.upcycle.teachers.teacher import TeacherShape

# The published Zebra-Llama placements (dense layer indices) for (teacher layers, MLA layers): SMART's choices,
# which `--mla N` reproduces for these teachers; other (L, N) get evenly rounded positions.
PUBLISHED_PLACEMENTS = {
    (16, 4): (0, 5, 10, 14),
    (28, 6): (0, 5, 10, 16, 21, 26),
    (32, 8): (0, 4, 8, 12, 16, 20, 25, 30),
}
PUBLISHED_WIDTH, PUBLISHED_KV_RANK, PUBLISHED_Q_RANK = 2048, 128, 1344
ALL_LAYERS = "all"  # `--mla-layers all`
SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "tie_word_embeddings")


@dataclass(frozen=True)
class StudentOptions:
    """The choices `zebra upcycle` leaves to the user (None = default, or the recipe's value)."""

    mixer: str | None = None  # "mamba", "gdn" or "kda"
    mla: int | None = None  # number of MLA layers
    mla_layers: tuple[int, ...] | str | None = None  # dense layer indices of the MLA layers, or "all"
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    recipe: str | None = None  # a recipe name or path whose model shapes to use
    latent_norm: bool | None = (
        None  # MLA latent RMSNorms (None: none, as published; with a recipe, the recipe's)
    )


@dataclass(frozen=True)
class StudentPlan:
    """The student: ZebraConfig keyword arguments, its MLA layers (dense indices) and its recurrent kind."""

    config: dict[str, Any]
    mla_layers: tuple[int, ...]
    mixer: str  # "mamba2", "gdn" or "kda"
    recipe: Any = None  # the loaded recipe, when one was given


def mla_placement(num_layers: int, count: int) -> tuple[int, ...]:
    """`count` MLA layers among `num_layers` dense layers: 0 and L-2 always, gaps as even as possible.

    >>> mla_placement(16, 4), mla_placement(16, 8)
    ((0, 5, 10, 14), (0, 2, 4, 6, 8, 10, 12, 14))
    """
    if not 0 <= count <= num_layers:
        raise ZebraError(
            f"--mla {count}: must be between 0 and {num_layers}, the teacher's layers",
            fix="pass fewer MLA layers, or --mla-layers with explicit indices",
        )
    if count >= num_layers - 1:  # L - 1 layers fit 0..L-2; L is every layer
        return tuple(range(count))
    if (num_layers, count) in PUBLISHED_PLACEMENTS:
        return PUBLISHED_PLACEMENTS[num_layers, count]
    if count <= 1:
        return (0,) * count
    last = num_layers - 2
    return tuple(math.floor(k * last / (count - 1) + 0.5) for k in range(count))


def parse_mla_layers(text: str) -> tuple[int, ...] | str:
    """`"0,5,10,14"` -> (0, 5, 10, 14); distinct, sorted (the range is checked against the teacher later);
    `"all"` stays "all" (every layer MLA: the all-MLA student of the ILD stage)."""
    if text.strip().lower() == ALL_LAYERS:
        return ALL_LAYERS
    try:
        layers = tuple(sorted(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ZebraError(f"--mla-layers {text}: not a comma-separated list of layer numbers",
                         fix="pass e.g. --mla-layers 0,5,10,14") from None  # fmt: skip
    if len(set(layers)) != len(layers):
        raise ZebraError(f"--mla-layers {text}: repeats a layer", fix="list each MLA layer once")
    return layers


def check_mla_layers(layers: tuple[int, ...] | str, num_layers: int) -> tuple[int, ...]:
    if layers == ALL_LAYERS:
        return tuple(range(num_layers))
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ZebraError(
            f"--mla-layers {','.join(map(str, layers))}: layer {bad[0]} is outside 0..{num_layers - 1}",
            fix=f"the teacher has {num_layers} layers; list indices 0..{num_layers - 1}",
        )
    return layers


def matrix_ranks(shape: TeacherShape) -> tuple[int, int]:
    """(rank bound of W_q, rank bound of [W_k; W_v]): min(rows, columns)."""
    d, dh = shape.hidden_size, shape.head_dim
    return min(shape.num_heads * dh, d), min(2 * shape.num_kv_heads * dh, d)


def default_ranks(shape: TeacherShape) -> tuple[int, int, int]:
    """(q_lora_rank, kv_lora_rank, qk_rope_head_dim): the published 1B choice scaled to this teacher."""
    q_max, kv_max = matrix_ranks(shape)
    scale = shape.hidden_size / PUBLISHED_WIDTH

    def round8(x: float, cap: int) -> int:
        return min(max(8, int(x / 8 + 0.5) * 8), cap)

    rope = max(2, shape.head_dim // 2 // 2 * 2)
    return round8(PUBLISHED_Q_RANK * scale, q_max), round8(PUBLISHED_KV_RANK * scale, kv_max), rope


def upcycle_mixers() -> dict[str, MixerSpec]:
    """{`--mixer` name: the mixer} of the recurrent mixers that attention can be copied into (those with an
    upcycle adapter, `MixerSpec.upcycle`), their aliases first (`--mixer mamba`, as the paper says)."""
    mixers = [m for m in MIXERS.values() if m.state == "recurrent" and m.upcycle is not None]
    return {**{a: m for m in mixers for a in m.upcycle.aliases}, **{m.name: m for m in mixers}}


def mixer_shapes(shape: TeacherShape, mixer: str, problems: list[str]) -> dict[str, Any]:
    """ZebraConfig keyword arguments (the registry's `<config_prefix>_<field>` keys) of the recurrent mixer that
    carries the teacher's attention; what cannot be built is appended to `problems`."""
    spec = recurrent_spec(mixer)
    return spec.prefixed(spec.upcycle.fields(shape, problems))


def mla_shapes(
    shape: TeacherShape,
    q_rank: int,
    kv_rank: int,
    rope_dim: int,
    problems: list[str],
    *,
    recipe: bool = False,
) -> dict[str, Any]:
    """ZebraConfig MLA keyword arguments; a rank above the matrix rank or a bad rope dim goes to `problems`
    (named as the flag, or as the recipe key when `recipe`)."""

    def flag(name: str) -> str:
        return f"model.mla.{name}" if recipe else "--" + name.replace("_", "-")

    q_max, kv_max = matrix_ranks(shape)
    h, kv, dh, d = shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.hidden_size
    if not 0 <= q_rank <= q_max:
        problems.append(
            f"{flag('q_lora_rank')} {q_rank} is above the rank of W_q ({q_max} = min({h}*{dh}, {d}))"
        )
    if not 1 <= kv_rank <= kv_max:
        problems.append(
            f"{flag('kv_lora_rank')} {kv_rank} is above the rank of [W_k; W_v] ({kv_max} = min(2*{kv}*{dh}, {d}))"
        )
    if rope_dim < 2 or rope_dim % 2 or rope_dim > dh:
        problems.append(
            f"{flag('qk_rope_head_dim')} {rope_dim} must be even, between 2 and the head dim {dh}"
        )
    return dict(
        num_attention_heads=h, q_lora_rank=q_rank, kv_lora_rank=kv_rank,
        qk_nope_head_dim=dh - rope_dim, qk_rope_head_dim=rope_dim, v_head_dim=dh,
    )  # fmt: skip


def plan_student(shape: TeacherShape, options: StudentOptions) -> StudentPlan:
    """The student's config from the teacher's shape and the options (or a recipe's shapes)."""
    if options.mla is not None and options.mla_layers is not None:
        raise ZebraError("--mla and --mla-layers both given", fix="pass one of them")
    if options.recipe is not None:
        return _plan_from_recipe(shape, options)
    mixer = mixer_name(options.mixer or "mamba")
    if options.mla_layers is not None:
        mla_layers = check_mla_layers(options.mla_layers, shape.num_layers)
    else:
        mla_layers = mla_placement(
            shape.num_layers, options.mla if options.mla is not None else max(1, round(shape.num_layers / 4))
        )
    q_rank, kv_rank, rope_dim = default_ranks(shape)
    problems: list[str] = []
    config = {
        **_teacher_config(shape),
        "recurrent_type": mixer,
        **mixer_shapes(shape, mixer, problems),
        **mla_shapes(
            shape,
            q_rank if options.q_lora_rank is None else options.q_lora_rank,
            kv_rank if options.kv_lora_rank is None else options.kv_lora_rank,
            rope_dim if options.qk_rope_head_dim is None else options.qk_rope_head_dim,
            problems,
        ),
        "layer_pattern": pattern(shape.num_layers, mla_layers, mixer),
        "mla_latent_norm": bool(options.latent_norm),
    }
    if problems:
        raise ZebraError("; ".join(problems), fix="choose ranks within these bounds, or another --mixer")
    return StudentPlan(config, mla_layers, mixer)


def mixer_name(flag: str) -> str:
    """The registry name (`zebra.mixers`) of `--mixer`; a ZebraError for one that cannot carry attention."""
    mixers = upcycle_mixers()
    if flag not in mixers:
        choices = ", ".join(n for n, m in mixers.items() if n in m.upcycle.aliases or not m.upcycle.aliases)
        raise ZebraError(f"--mixer {flag}: unknown, or not one that attention can be copied into",
                         fix=f"use one of {choices}")  # fmt: skip
    return mixers[flag].name


def pattern(num_layers: int, mla_layers: tuple[int, ...], mixer: str) -> str:
    """The sublayer pattern: dense layer i -> (mixer, MLP), the mixer MLA (`*`) at the MLA layers."""
    char = recurrent_spec(mixer).char
    return "".join((ATTENTION if i in mla_layers else char) + MLP for i in range(num_layers))


def _teacher_config(shape: TeacherShape) -> dict[str, Any]:
    """The ZebraConfig keyword arguments that come from the teacher whatever the options."""
    return {
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": 2 * shape.num_layers,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rope_scaling": student_rope(shape),
        **{k: v for k, v in shape.special_ids.items() if v is not None},
    }


# YaRN's attention temperature on every query/key channel (mscale = mscale_all_dim: cos/sin unscaled, softmax
# scale times (0.1 ln factor + 1)^2), as DeepSeek-V3's and HF's YaRN apply it.
YARN_MSCALE = 1.0


def student_rope(shape: TeacherShape) -> dict[str, Any]:
    """The student's `rope_scaling`: plain RoPE (factor 1) for a teacher without a context extension; for one
    with (Llama 3's `llama3` factor 32 from 8192, a `yarn` teacher...), YaRN over the d_rope channels with the
    teacher's factor and original context, as the published students (factor 32 or 8, original 8192)."""
    if shape.rope_factor <= 1.0:
        return {
            "type": "yarn",
            "factor": 1.0,
            "original_max_position_embeddings": shape.max_position_embeddings,
        }
    return {
        "type": "yarn",
        "factor": shape.rope_factor,
        "original_max_position_embeddings": shape.rope_original_max or shape.max_position_embeddings,
        "mscale": YARN_MSCALE,
        "mscale_all_dim": YARN_MSCALE,
    }


def _plan_from_recipe(shape: TeacherShape, options: StudentOptions) -> StudentPlan:
    """A recipe's model shapes, checked against the teacher; one error lists every mismatch."""
    from zebra.recipes import load_recipe

    for flag, value in (("--kv-lora-rank", options.kv_lora_rank), ("--q-lora-rank", options.q_lora_rank),
                        ("--qk-rope-head-dim", options.qk_rope_head_dim)):  # fmt: skip
        if value is not None:
            raise ZebraError(
                f"{flag} and --recipe both given", fix="set the rank in the recipe, or drop --recipe"
            )
    recipe = load_recipe(options.recipe)
    flat = recipe.model.flat()
    mixer = flat["recurrent_type"]
    if mixer not in {m.name for m in upcycle_mixers().values()}:
        names = ", ".join(dict.fromkeys(m.name for m in upcycle_mixers().values()))
        raise ZebraError(f"--recipe {options.recipe}: model.recurrent_type {mixer} cannot be upcycled from attention",
                         fix=f"use a recipe whose recurrent_type is one of {names}")  # fmt: skip
    mismatches = []
    if options.mixer is not None and mixer_name(options.mixer) != mixer:
        mismatches.append(f"model.recurrent_type {mixer} (--mixer {options.mixer})")
    recipe_pattern = _recipe_pattern(flat, options, mixer, mismatches)
    mla_layers = tuple(i for i in range(len(recipe_pattern) // 2) if recipe_pattern[2 * i] == ATTENTION)
    flat["layer_pattern"] = recipe_pattern
    expected = _teacher_config(shape)
    if recurrent_spec(mixer).char in recipe_pattern:
        expected.update(mixer_shapes(shape, mixer, mismatches))
    if ATTENTION in recipe_pattern:
        ranks = (flat["q_lora_rank"], flat["kv_lora_rank"], flat["qk_rope_head_dim"])
        expected.update(mla_shapes(shape, *ranks, mismatches, recipe=True))
    for key, want in expected.items():
        if key in ("rope_scaling", "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings"):
            continue
        got = flat.get(key)
        if key == "num_hidden_layers" and got != want:  # the recipe counts sublayers, a teacher counts layers
            mismatches.append(f"model.num_layers {got!r} = {got // 2} layers (teacher: {want // 2} layers)")
        elif not _same(flat.get(key), want):
            mismatches.append(f"{key} {flat.get(key)!r} (teacher: {want!r})")
    if mismatches:
        raise ZebraError(
            f"--recipe {options.recipe} does not fit the teacher: {'; '.join(mismatches)}",
            fix="use a recipe made for this teacher, or leave out --recipe to take every shape from the teacher",
        )
    config = {**flat, **{k: v for k, v in shape.special_ids.items() if v is not None}}
    if options.latent_norm is not None:
        config["mla_latent_norm"] = options.latent_norm
    return StudentPlan(config, mla_layers, mixer, recipe)


def _recipe_pattern(flat: dict[str, Any], options: StudentOptions, mixer: str, mismatches: list[str]) -> str:
    """The recipe's sublayer pattern, or the recipe's layers with `--mla` / `--mla-layers`; a pattern that is not
    mixer/MLP pairs of one recurrent kind goes to `mismatches`."""
    from zebra.spec import arch

    try:
        recipe_pattern = arch.resolve_pattern(arch.as_config(flat))
    except ValueError as e:
        raise ZebraError(f"--recipe {options.recipe}: {e}", fix="fix the recipe's model.pattern") from None
    layers = len(recipe_pattern) // 2
    if options.mla_layers is not None:
        recipe_pattern = pattern(layers, check_mla_layers(options.mla_layers, layers), mixer)
    elif options.mla is not None:
        recipe_pattern = pattern(layers, mla_placement(layers, options.mla), mixer)
    mixers, mlps = set(recipe_pattern[0::2]), set(recipe_pattern[1::2])
    if mixers - {ATTENTION, recurrent_spec(mixer).char} or mlps != {MLP}:
        mismatches.append(
            f"model.pattern {recipe_pattern!r} (expected mixer/MLP pairs with one recurrent kind)"
        )
    return recipe_pattern


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return math.isclose(got, want, rel_tol=1e-6)
    return got == want
