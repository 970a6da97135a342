"""`ZebraConfig`: the flat, HF-style configuration of a Zebra hybrid model.

The keyword arguments are exactly those of `zebra.recipes.schema.ModelSpec.flat()`. The sublayer pattern (one
character per sublayer, each a key of `zebra.mixers.MIXERS`) comes from `layer_pattern` or, when that is empty,
from `hybrid_attention_ratio` by Primus' algorithm (`zebra.spec.arch.resolve_pattern`); the resolved string is stored
back in `layer_pattern`, so a saved config.json always lists the explicit pattern. The sizes of each registered
mixer are keyword arguments `<config_prefix>_<field>` with the defaults of its `MixerSpec.config_defaults`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import PretrainedConfig

from zebra.mixers import MIXERS, MLA, mamba_num_heads, recurrent_names
from zebra.spec.arch import KERNEL_BACKENDS, resolve_pattern, used_mixers
from zebra.spec.arch import MODEL_DEFAULTS as DEFAULT

POSITIVE_SIZES = (
    *("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "max_position_embeddings"),
    *("num_attention_heads", "kv_lora_rank", "v_head_dim"),
)
# YaRN keys and their defaults (Megatron's MLATransformerConfig: beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 0;
# factor and original_max_position_embeddings: MLA's fields, `zebra.mixers.mla`).
YARN_DEFAULTS: dict[str, Any] = {
    "rope_type": "yarn",
    **{
        MLA.config_key(name).partition(".")[2]: default
        for name, default in MLA.config_defaults.items()
        if MLA.config_key(name).startswith("rope_scaling.")
    },
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.0,
}


class ZebraConfig(PretrainedConfig):
    """Configuration of `ZebraForCausalLM`: a stack of pre-norm residual sublayers (Mamba2 `M`, Gated DeltaNet `G`,
    Kimi Delta Attention `K`, Multi-Latent Attention `*`, SwiGLU MLP `-`: the kinds of `zebra.mixers.MIXERS`).

    Args (the defaults: `zebra.spec.arch.MODEL_DEFAULTS` and the mixers' `fields`):
        vocab_size: vocabulary size V.
        hidden_size: model width D.
        intermediate_size: SwiGLU inner width F.
        num_hidden_layers: number of sublayers (mixers + MLPs, Megatron numbering); equals len(layer_pattern).
        recurrent_type: "mamba2", "gdn" or "kda" (a registered mixer with a recurrent state): the recurrent mixer
            placed by `hybrid_attention_ratio`.
        hybrid_attention_ratio: fraction of mixer sublayers that are MLA (used when `layer_pattern` is empty).
        layer_pattern: explicit sublayer string such as "*-M-M-M-" (overrides the ratio).
        rms_norm_eps: epsilon of every RMSNorm except Mamba2's gated norm (Megatron fixes that one at 1e-5).
        tie_word_embeddings: share `model.embeddings.weight` with `lm_head.weight`.
        initializer_range: standard deviation of the normal initialiser.
        max_position_embeddings: longest position RoPE is set up for.
        kernel_backend: "auto", "torch", "fla" or "mamba_ssm" (see `zebra_kernels.resolve_backend`).
        num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim: MLA shape
            (q_lora_rank 0 = an uncompressed query projection); these and the next three are MLA's fields, with
            their defaults, in `zebra.mixers.mla`.
        mla_latent_norm: an RMSNorm on the MLA query and key/value latents (DeepSeek-V2, recipes trained from
            scratch); False: none, the down factor feeds the up factor directly (the published Zebra-Llama
            students, `use_lora_layer_norm: false`: what `zebra upcycle` makes).
        mla_rope: rotate the `qk_rope_head_dim` channels by position (RoPE / YaRN); False: NoPE, the shared key
            part is used unrotated (Kimi-Linear's MLA).
        rope_theta: RoPE base.
        rope_scaling: YaRN parameters {"type": "yarn", "factor", "original_max_position_embeddings", and optionally
            "beta_fast", "beta_slow", "mscale", "mscale_all_dim"}; factor 1.0 is plain RoPE. Stored (HF 5 style)
            as `rope_parameters`.
        **kwargs: the sizes of the registered mixers, `<config_prefix>_<field>` for each of the mixer's
            `fields` (declared, with defaults and docs, in its module `zebra.mixers.<name>`: `gdn_*`, `kda_*`,
            `gla_*`, `mamba_*`; docs/recipes.md lists them as `model.<section>.<field>`).
            Anything else goes to `transformers.PretrainedConfig`.
    """

    model_type = "zebra"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache"]

    def __init__(
        self,
        vocab_size: int = DEFAULT["vocab_size"],
        hidden_size: int = DEFAULT["hidden_size"],
        intermediate_size: int = DEFAULT["intermediate_size"],
        num_hidden_layers: int = DEFAULT["num_hidden_layers"],
        recurrent_type: str = DEFAULT["recurrent_type"],
        hybrid_attention_ratio: float = DEFAULT["hybrid_attention_ratio"],
        layer_pattern: str | None = DEFAULT["layer_pattern"],
        rms_norm_eps: float = DEFAULT["rms_norm_eps"],
        tie_word_embeddings: bool = DEFAULT["tie_word_embeddings"],
        initializer_range: float = DEFAULT["initializer_range"],
        max_position_embeddings: int = DEFAULT["max_position_embeddings"],
        kernel_backend: str = DEFAULT["kernel_backend"],
        rope_scaling: dict[str, Any] | None = None,
        rope_parameters: dict[str, Any] | None = None,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        **kwargs: Any,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.recurrent_type = recurrent_type
        self.hybrid_attention_ratio = hybrid_attention_ratio
        self.rms_norm_eps = rms_norm_eps
        self.tie_word_embeddings = tie_word_embeddings
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.kernel_backend = kernel_backend
        self.use_cache = use_cache
        for spec in MIXERS.values():  # MLA's keys (rope_theta among them) and the recurrent mixers' sizes
            for key, default in spec.config_kwargs().items():
                setattr(self, key, kwargs.pop(key, default))
        self.rope_parameters = _rope_parameters(self.rope_theta, rope_scaling, rope_parameters)
        self.rope_theta = self.rope_parameters["rope_theta"]
        self.layer_pattern = layer_pattern
        self._validate()
        try:
            self.layer_pattern = resolve_pattern(self)
        except ValueError as error:
            raise ValueError(f"ZebraConfig: {error}") from None
        self._validate_mixers()
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    @property
    def mamba_num_heads(self) -> int:
        """Mamba2 heads Hm = expand * hidden_size / head_dim."""
        return mamba_num_heads(self)

    def _validate_yarn_rope_parameters(
        self, rope_parameters: dict[str, Any], ignore_keys: Any = None
    ) -> None:
        """Checked by `_rope_parameters` instead: HF's YaRN check wants factor == max_position_embeddings /
        original_max_position_embeddings, which does not hold for factor 1.0 (plain RoPE) recipes."""

    def _validate(self) -> None:
        """Raise ValueError naming the offending values; called before the pattern is resolved."""
        bad = {name: getattr(self, name) for name in POSITIVE_SIZES if not _is_int(getattr(self, name), 1)}
        bad.update(
            {
                n: getattr(self, n)
                for n in ("q_lora_rank", "qk_nope_head_dim")
                if not _is_int(getattr(self, n), 0)
            }
        )
        if bad:
            raise ValueError(f"ZebraConfig: these sizes must be positive integers: {bad}")
        if self.qk_rope_head_dim < 2 or self.qk_rope_head_dim % 2:
            raise ValueError(
                f"ZebraConfig: qk_rope_head_dim={self.qk_rope_head_dim} must be even and >= 2 (RoPE pairs)"
            )
        for flag in ("mla_latent_norm", "mla_rope"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"ZebraConfig: {flag}={getattr(self, flag)!r} must be true or false")
        if self.recurrent_type not in recurrent_names():
            raise ValueError(
                f"ZebraConfig: recurrent_type={self.recurrent_type!r} is not one of {sorted(recurrent_names())}"
            )
        if not 0.0 <= self.hybrid_attention_ratio <= 1.0:
            raise ValueError(
                f"ZebraConfig: hybrid_attention_ratio={self.hybrid_attention_ratio} is outside [0, 1]"
            )
        if self.kernel_backend not in KERNEL_BACKENDS:
            raise ValueError(
                f"ZebraConfig: kernel_backend={self.kernel_backend!r} is not one of {KERNEL_BACKENDS}"
            )
        if not 0.0 <= self.rms_norm_eps <= 1e-2:
            raise ValueError(f"ZebraConfig: rms_norm_eps={self.rms_norm_eps} is outside [0, 1e-2]")
        if self.layer_pattern and len(self.layer_pattern) != self.num_hidden_layers:
            raise ValueError(
                f"ZebraConfig: layer_pattern {self.layer_pattern!r} has {len(self.layer_pattern)} sublayers but "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        if not self.layer_pattern and self.num_hidden_layers % 2:
            raise ValueError(
                f"ZebraConfig: num_hidden_layers={self.num_hidden_layers} must be even (each mixer is followed by an MLP)"
            )

    def _validate_mixers(self) -> None:
        """The sizes of the mixers the resolved pattern uses: integers >= 1, then each mixer's own rules."""
        for spec in used_mixers(self.layer_pattern):
            sizes = {k: getattr(self, k) for k, v in spec.config_kwargs().items() if _is_int(v, 0)}
            floor = {
                spec.config_key(f.name): 0 if f.min == 0 else 1 for f in spec.fields
            }  # MLA's ranks: 0 too
            bad = {k: v for k, v in sizes.items() if not _is_int(v, floor.get(k, 1))}
            if bad:
                raise ValueError(f"ZebraConfig: these sizes must be positive integers: {bad}")
            for name, problem in spec.check(self):
                key = spec.config_key(name)
                raise ValueError(f"ZebraConfig: {key}={getattr(self, key)!r}: {problem}")


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _rope_parameters(
    rope_theta: float, rope_scaling: dict[str, Any] | None, rope_parameters: dict[str, Any] | None
) -> dict[str, Any]:
    """Merge the flat `rope_theta` + `rope_scaling` (recipes) or a saved `rope_parameters` into one YaRN dict."""
    out = dict(YARN_DEFAULTS, rope_theta=float(rope_theta))
    for source in (rope_scaling, rope_parameters):
        if not source:
            continue
        source = dict(source)
        kind = source.pop("type", None) or source.pop("rope_type", None) or "yarn"
        if kind not in ("yarn", "default"):
            raise ValueError(
                f"ZebraConfig: rope type {kind!r} is not supported (use 'yarn'; factor 1.0 = plain RoPE)"
            )
        unknown = sorted(set(source) - set(YARN_DEFAULTS) - {"rope_theta"})
        if unknown:
            raise ValueError(
                f"ZebraConfig: unknown rope_scaling keys {unknown} (allowed: {sorted(YARN_DEFAULTS)})"
            )
        out.update(source)
    if not isinstance(out["factor"], (int, float)) or out["factor"] < 1.0:
        raise ValueError(f"ZebraConfig: rope_scaling factor={out['factor']!r} must be a number >= 1.0")
    if out["rope_theta"] <= 0:
        raise ValueError(f"ZebraConfig: rope_theta={out['rope_theta']} must be positive")
    out["factor"] = float(out["factor"])
    return out
