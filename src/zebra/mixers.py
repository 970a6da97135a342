"""The mixer registry: every sublayer kind a layer pattern can hold, in one torch-free table.

`MIXERS` maps each pattern character to a `MixerSpec` (modelled on `zebra.convert.formats.FORMATS`), and every
part of zebra that depends on the kind of a sublayer reads it from there:

- the model builds each sublayer from `layer`, a dotted class path imported on first use (this module imports
  nothing heavy: `zebra recipes list` reads it, and the HF export copies it);
- the decode cache (`ZebraCache`) gives a sublayer a slot of the kind `state` with the shapes `state_shapes`;
- `zebra.arch` counts `params` and the state bytes, and places the `recurrent_type` mixer by the ratio;
- `ZebraConfig` takes the keys `<config_prefix>_<field>` of `config_defaults`, and `ZebraConfig` and the recipe
  loader both run `check` when a pattern uses the mixer;
- the recipe schema fills those keys from the section `model.<section>`, whose fields are named as in
  `config_defaults`;
- `zebra recipes list` prints `label`, the model card `title` and `summary`.

Every function of a spec reads a *flat* configuration: any object with the attributes of `ZebraConfig` (the config
itself, or `Recipe.model.flat()` through `zebra.arch.as_config`). Adding a mixer: docs/models.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MLP = "-"  # the SwiGLU MLP character: every other sublayer must be followed by one
ATTENTION = "*"  # the MLA character: what `hybrid_attention_ratio` places between the recurrent mixers

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class MixerSpec:
    """One sublayer kind.

    Attributes:
        char: its character in a layer pattern ("M").
        name: its name in `recurrent_type` and in `zebra.arch.param_count(...).by_kind` ("mamba2").
        label: short display name (`zebra recipes list`: "Mamba2", "GDN").
        title: long display name (model card: "Gated DeltaNet").
        layer: dotted path of the `nn.Module` class; the class has `from_config(config, layer_idx)`,
            `reset_parameters()` and the sublayer call signature (docs/models.md). Imported when a model is built.
        params: `cfg -> int`, the parameters of one such sublayer, its pre-norm left out.
        state: the kind of its decode-cache slot: "recurrent" (fixed-size `recurrent` and `conv` tensors: float32,
            and the model dtype for a static cache's `conv`; such a mixer can be the `recurrent_type` that `hybrid_attention_ratio` places), "latent" (tensors that
            grow by one row per token, in the model dtype) or None (no state).
        state_shapes: `(cfg, batch_size, max_length) -> {tensor name: shape}` of the slot (a static cache
            allocates these; names are the slot's fields: `recurrent`, `conv` or `latent`, `k_rope`).
        config_prefix: its `ZebraConfig` keys are `<config_prefix>_<field>`; "" when they are plain HF names.
        config_defaults: `{field: default}` of those keys (empty when `ZebraConfig` declares them itself).
        section: the recipe section `model.<section>` holding its sizes (fields named as in `config_defaults`).
        check: `cfg -> [(field, problem)]`, the rules between its sizes that one field's range cannot express;
            `field` is named within `section`; run only when the pattern uses the mixer.
        summary: `cfg -> str`, its sizes in one line (the model card).
    """

    char: str
    name: str
    label: str
    title: str
    layer: str
    params: Callable[[Any], int]
    state: str | None = None
    state_shapes: Callable[[Any, int, int], Shapes] = lambda cfg, batch_size, max_length: {}
    config_prefix: str = ""
    config_defaults: dict[str, Any] = field(default_factory=dict)
    section: str | None = None
    check: Callable[[Any], list[tuple[str, str]]] = lambda cfg: []
    summary: Callable[[Any], str] = lambda cfg: ""

    def config_key(self, field_name: str) -> str:
        """The `ZebraConfig` key of one of its fields (`num_heads` -> `gdn_num_heads`)."""
        return f"{self.config_prefix}_{field_name}" if self.config_prefix else field_name

    def config_kwargs(self) -> dict[str, Any]:
        """`{ZebraConfig key: default}` of its prefixed keys."""
        return {self.config_key(k): v for k, v in self.config_defaults.items()}


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


# ---------------------------------------------------------------------------------------------- Mamba2 'M'
def mamba_num_heads(cfg: Any) -> int:
    """Mamba2 heads Hm = expand * hidden_size / head_dim."""
    return cfg.mamba_expand * cfg.hidden_size // cfg.mamba_head_dim


def _mamba2_params(cfg: Any) -> int:
    d, d_inner, heads = cfg.hidden_size, cfg.mamba_expand * cfg.hidden_size, mamba_num_heads(cfg)
    gn = cfg.mamba_num_groups * cfg.mamba_state_dim
    n = d * (2 * d_inner + 2 * gn + heads)  # in_proj -> [z | x | B | C | dt]
    n += (d_inner + 2 * gn) * (cfg.mamba_conv_size + 1)  # conv1d weight + bias over xBC
    n += 3 * heads  # A_log, D, dt_bias
    n += d_inner  # gated RMSNorm
    return n + d_inner * d  # out_proj


def _mamba2_state(cfg: Any, batch_size: int, max_length: int) -> Shapes:
    conv_channels = cfg.mamba_expand * cfg.hidden_size + 2 * cfg.mamba_num_groups * cfg.mamba_state_dim
    return {
        "recurrent": (batch_size, mamba_num_heads(cfg), cfg.mamba_state_dim, cfg.mamba_head_dim),
        "conv": (batch_size, conv_channels, cfg.mamba_conv_size),
    }


def _mamba2_check(cfg: Any) -> list[tuple[str, str]]:
    inner = cfg.mamba_expand * cfg.hidden_size
    if inner % cfg.mamba_head_dim:
        return [("head_dim", f"expand*hidden_size {inner} is not divisible by {cfg.mamba_head_dim}")]
    if (inner // cfg.mamba_head_dim) % cfg.mamba_num_groups:
        return [
            (
                "num_groups",
                f"{inner // cfg.mamba_head_dim} heads do not split into {cfg.mamba_num_groups} groups "
                "(expected a divisor of the head count)",
            )
        ]
    return _conv_check(cfg.mamba_conv_size)


def _conv_check(width: int) -> list[tuple[str, str]]:
    return [] if width >= 2 else [("conv_size", f"{width} is below 2 (expected a convolution width >= 2)")]


register_mixer(
    MixerSpec(
        char="M",
        name="mamba2",
        label="Mamba2",
        title="Mamba2",
        layer="zebra.models.layers.mamba2.Mamba2",
        params=_mamba2_params,
        state="recurrent",
        state_shapes=_mamba2_state,
        config_prefix="mamba",
        config_defaults={"state_dim": 64, "head_dim": 64, "num_groups": 8, "expand": 1, "conv_size": 4},
        section="mamba",
        check=_mamba2_check,
        summary=lambda c: (
            f"state {c.mamba_state_dim}, head {c.mamba_head_dim}, groups {c.mamba_num_groups}, "
            f"expand {c.mamba_expand}"
        ),
    )
)


# ------------------------------------------------------------------------------------- Gated DeltaNet 'G'
def _gdn_params(cfg: Any) -> int:
    d = cfg.hidden_size
    key, val = cfg.gdn_num_heads * cfg.gdn_head_dim, cfg.gdn_num_v_heads * cfg.gdn_head_v_dim
    hv = cfg.gdn_num_v_heads
    n = d * (2 * key + 2 * val + 2 * hv)  # q, k, v, g (gate), a, b projections
    n += val * d  # o_proj
    n += (2 * key + val) * cfg.gdn_conv_size  # depthwise convs, no bias
    return n + 2 * hv + cfg.gdn_head_v_dim  # A_log, dt_bias, o_norm


def _gdn_state(cfg: Any, batch_size: int, max_length: int) -> Shapes:
    key, val = cfg.gdn_num_heads * cfg.gdn_head_dim, cfg.gdn_num_v_heads * cfg.gdn_head_v_dim
    return {
        "recurrent": (batch_size, cfg.gdn_num_v_heads, cfg.gdn_head_dim, cfg.gdn_head_v_dim),
        "conv": (batch_size, 2 * key + val, cfg.gdn_conv_size),
    }


def _gdn_check(cfg: Any) -> list[tuple[str, str]]:
    if cfg.gdn_num_v_heads % cfg.gdn_num_heads:
        return [("num_v_heads", f"{cfg.gdn_num_v_heads} is not a multiple of num_heads {cfg.gdn_num_heads}")]
    return _conv_check(cfg.gdn_conv_size)


register_mixer(
    MixerSpec(
        char="G",
        name="gdn",
        label="GDN",
        title="Gated DeltaNet",
        layer="zebra.models.layers.gated_deltanet.GatedDeltaNet",
        params=_gdn_params,
        state="recurrent",
        state_shapes=_gdn_state,
        config_prefix="gdn",
        config_defaults={
            "num_heads": 8,
            "head_dim": 64,
            "num_v_heads": 16,
            "head_v_dim": 64,
            "conv_size": 4,
            "allow_neg_eigval": False,
        },
        section="gdn",
        check=_gdn_check,
        summary=lambda c: (
            f"{c.gdn_num_heads} key heads x {c.gdn_head_dim}, {c.gdn_num_v_heads} value heads x "
            f"{c.gdn_head_v_dim}, conv {c.gdn_conv_size}"
        ),
    )
)


# ------------------------------------------------------------------------------- Kimi Delta Attention 'K'
def _kda_params(cfg: Any) -> int:
    d, h, dk, dv = cfg.hidden_size, cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_head_v_dim
    key, val = h * dk, h * dv
    n = d * (2 * key + val)  # q, k, v
    n += d * dv + dv * key  # f_proj: D -> dv -> H*K (decay)
    n += d * h  # b_proj (beta)
    n += (
        d * dv + dv * val + val * bool(getattr(cfg, "kda_gate_bias", True))
    )  # g_proj: D -> dv -> H*V (+ bias)
    n += val * d  # o_proj
    n += (2 * key + val) * cfg.kda_conv_size
    return n + h + key + dv  # A_log [H], dt_bias [H*K], o_norm [V]


def _kda_state(cfg: Any, batch_size: int, max_length: int) -> Shapes:
    h, dk, dv = cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_head_v_dim
    return {
        "recurrent": (batch_size, h, dk, dv),
        "conv": (batch_size, h * (2 * dk + dv), cfg.kda_conv_size),
    }


register_mixer(
    MixerSpec(
        char="K",
        name="kda",
        label="KDA",
        title="Kimi Delta Attention",
        layer="zebra.models.layers.kda.KimiDeltaAttention",
        params=_kda_params,
        state="recurrent",
        state_shapes=_kda_state,
        config_prefix="kda",
        config_defaults={
            "num_heads": 16,
            "head_dim": 32,
            "head_v_dim": 64,
            "conv_size": 4,
            "gate_bias": True,
        },
        section="kda",
        check=lambda c: _conv_check(c.kda_conv_size),
        summary=lambda c: (
            f"{c.kda_num_heads} heads, key {c.kda_head_dim}, value {c.kda_head_v_dim}, conv {c.kda_conv_size}"
            + ("" if getattr(c, "kda_gate_bias", True) else ", output gate without bias")
        ),
    )
)


# ------------------------------------------------------------------------------ Multi-Latent Attention '*'
def _mla_params(cfg: Any) -> int:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    norms = bool(getattr(cfg, "mla_latent_norm", True))  # the latent RMSNorms' weights
    if cfg.q_lora_rank:
        q = d * cfg.q_lora_rank + norms * cfg.q_lora_rank + cfg.q_lora_rank * h * qk
    else:
        q = d * h * qk
    kv = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + norms * cfg.kv_lora_rank
    kv += cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return q + kv + h * cfg.v_head_dim * d


def _mla_check(cfg: Any) -> list[tuple[str, str]]:
    if cfg.qk_rope_head_dim % 2:
        return [("qk_rope_head_dim", f"{cfg.qk_rope_head_dim} is odd (expected an even count for RoPE)")]
    return []


register_mixer(
    MixerSpec(
        char=ATTENTION,
        name="mla",
        label="MLA",
        title="MLA",
        layer="zebra.models.layers.mla.MultiLatentAttention",
        params=_mla_params,
        state="latent",
        state_shapes=lambda c, batch_size, max_length: {
            "latent": (batch_size, max_length, c.kv_lora_rank),
            "k_rope": (batch_size, max_length, c.qk_rope_head_dim),
        },
        section="mla",
        check=_mla_check,
        summary=lambda c: (
            f"{c.num_attention_heads} heads, q rank {c.q_lora_rank}, kv rank {c.kv_lora_rank}, nope/rope/v "
            f"{c.qk_nope_head_dim}/{c.qk_rope_head_dim}/{c.v_head_dim}, "
            + (
                f"RoPE theta {c.rope_theta}"
                if getattr(c, "mla_rope", True)
                else "no positional encoding (NoPE)"
            )
            + ("" if getattr(c, "mla_latent_norm", True) else ", no latent norms")
        ),
    )
)


# ----------------------------------------------------------------------------------------- SwiGLU MLP '-'
register_mixer(
    MixerSpec(
        char=MLP,
        name="mlp",
        label="MLP",
        title="SwiGLU MLP",
        layer="zebra.models.layers.swiglu.SwiGLU",
        params=lambda c: 3 * c.hidden_size * c.intermediate_size,
    )
)
