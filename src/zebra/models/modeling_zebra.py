"""`ZebraModel` and `ZebraForCausalLM`: the hybrid stack over the layer pattern, HF `PreTrainedModel`s.

Sublayer i of the pattern is `model.layers.{i}` with `.norm` (pre-norm RMSNorm) and `.mixer`; each is
`x = x + mixer(norm(x))`. The stack carries the residual stream `x` next to the last mixer output, so the add
runs inside the next norm's kernel (`norm(out, residual=x, prenorm=True)` returns the normed sum and the sum).
Names and shapes: docs/architecture.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from zebra.mixers import mixer_spec
from zebra.models.cache_zebra import ZebraCache
from zebra.models.configuration_zebra import ZebraConfig
from zebra.models.layer_classes import layer_class
from zebra.models.layers.norm import GatedRMSNorm, RMSNorm
from zebra.models.layers.packed import Prenorm, fused_decode_step
from zebra_kernels import linear_cross_entropy

# transformers renamed the outputs' cache field from `past_key_values` to `cache` during 5.x; use whichever the
# installed release has, so generate() finds the cache on every supported version (>=5.17,<6)
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def build_mixer(char: str, config: ZebraConfig, layer_idx: int) -> nn.Module:
    """The mixer module of sublayer `layer_idx` from its pattern character (`zebra.mixers.MIXERS`)."""
    spec = mixer_spec(char)
    if spec.layer_args is None:
        return layer_class(spec.layer).from_config(config, layer_idx)
    return layer_class(spec.layer)(**spec.layer_kwargs(config, layer_idx))


class ZebraSublayer(GradientCheckpointingLayer):
    """One pre-norm residual sublayer, `x + mixer(norm(x))`, with the add of the previous sublayer fused into
    its norm: takes the previous mixer output and the stream before it, returns its own mixer output and the
    stream `x` it normalised (the caller adds the last mixer output to the stream: `ZebraModel.norm`)."""

    def __init__(self, config: ZebraConfig, layer_idx: int):
        super().__init__()
        self.char = config.layer_pattern[layer_idx]
        self.layer_idx = layer_idx
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, backend=config.kernel_backend)
        self.mixer = build_mixer(self.char, config, layer_idx)
        self.mixer._is_zebra_mixer = True  # `_init_weights` calls its reset_parameters()

    def forward(
        self,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: ZebraCache | None = None,
        cu_seqlens: torch.Tensor | None = None,
        memo: dict | None = None,
        **unused: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`hidden_states` `[B, T, D]`: the previous mixer's output (the embeddings for the first sublayer, with
        `residual=None`); `residual` `[B, T, D]`: the stream before it; `memo`: the model forward's dict of what
        its sublayers share (MLA's RoPE and mask). Returns (mixer output, stream)."""
        kwargs = dict(
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            cu_seqlens=cu_seqlens,
            memo=memo,
        )
        if fused_decode_step(self.mixer, hidden_states):  # the norm in the mixer's first GEMV
            prenorm = Prenorm(self.norm, residual)
            h = self.mixer(hidden_states, prenorm=prenorm, **kwargs)
            if prenorm.stream is None:
                raise RuntimeError(
                    f"{type(self.mixer).__name__}: its first projection did not take the pre-norm"
                )
            return h, prenorm.stream
        h, residual = self.norm(hidden_states, residual, prenorm=True)  # stream x = hidden_states + residual
        return self.mixer(h, **kwargs), residual


class ZebraPreTrainedModel(PreTrainedModel):
    config_class = ZebraConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules: ClassVar[list[str]] = ["ZebraSublayer"]
    _supports_sdpa = True
    _is_stateful = True  # recurrent states cannot be rolled back (no assisted decoding)
    # HF's get/set_input_embeddings find `embeddings` here or on `.model`; get/set_output_embeddings use `lm_head`
    _input_embed_layer = "embeddings"

    def _init_weights(self, module: nn.Module) -> None:
        """HF-style init of what the layers leave to the model: Linear/Conv1d/Embedding ~ N(0, initializer_range)
        (residual output projections `o_proj`/`down_proj`/`out_proj` divided by sqrt(2 * sublayers), Megatron's
        output_layer_init_method), norms 1; then, once its submodules are done (HF visits children first), each
        mixer's own `reset_parameters()` (A_log, dt_bias, Mamba2's D and conv: see the layer classes). HF calls
        this only for modules with parameters of their own, so a mixer without any (SwiGLU, MLA) is skipped:
        it has nothing of its own to reset."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            if getattr(module, "_is_residual_out", False):
                std = std / math.sqrt(2.0 * self.config.num_hidden_layers)
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Conv1d):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, (RMSNorm, GatedRMSNorm)):
            init.ones_(module.weight)
        elif getattr(module, "_is_zebra_mixer", False):
            module.reset_parameters()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model builds its own ZebraCache (recurrent states + MLA latents)


class ZebraModel(ZebraPreTrainedModel):
    """The embedding, the sublayer stack and the final norm; returns hidden states `[B, T, D]`."""

    def __init__(self, config: ZebraConfig):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(ZebraSublayer(config, i) for i in range(len(config.layer_pattern)))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, backend=config.kernel_backend)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: ZebraCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cu_seqlens: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: ZebraCache | None = None,
        **unused: Any,
    ) -> BaseModelOutputWithPast:
        """Run the stack.

        Args:
            input_ids: `[B, T]` token ids (or `inputs_embeds` `[B, T, D]`).
            attention_mask: `[B, L]` 1 = token, 0 = padding, over cached + new tokens (L = cached + T).
            position_ids: `[B, T]` RoPE positions; default: from `attention_mask` (count of real tokens before each
                token), else from `cu_seqlens` (restarting per sequence), else cache offset + 0..T-1.
            cache: a `ZebraCache` to read and extend; with `use_cache` and no cache a dynamic one is created.
            use_cache: return the (new) cache (default `config.use_cache` outside training).
            cu_seqlens: `[N + 1]` offsets of sequences packed along T (B == 1, training/prefill without cache).
            output_hidden_states: also return every sublayer's input and the final output.
            past_key_values: older name of `cache`.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("ZebraModel: pass exactly one of input_ids and inputs_embeds")
        cache = cache if cache is not None else past_key_values
        if use_cache is None:
            use_cache = self.config.use_cache and not self.training
        if cu_seqlens is not None and (cache is not None or use_cache):
            raise ValueError("ZebraModel: packed sequences (cu_seqlens) cannot be combined with a cache")
        hidden_states = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # [B, T, D]
        T = hidden_states.shape[1]
        if use_cache and cache is None:
            cache = ZebraCache(self.config)
        if position_ids is None:
            position_ids = default_positions(T, attention_mask, cu_seqlens, cache, hidden_states.device)

        all_hidden = [] if output_hidden_states else None
        residual = None  # the stream before the last mixer output (hidden_states); None: only the embeddings
        memo = {}  # what the sublayers of this forward share (MLA's RoPE cos/sin and mask)
        for layer in self.layers:
            if all_hidden is not None:  # each sublayer's input x: the stream with the last output added
                all_hidden.append(hidden_states if residual is None else hidden_states + residual)
            hidden_states, residual = layer(
                hidden_states,
                residual,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                cu_seqlens=cu_seqlens,
                memo=memo,
            )
        if cache is not None:
            cache.advance(T)
        hidden_states = self.norm(hidden_states, residual)  # [B, T, D]
        if all_hidden is not None:
            all_hidden.append(hidden_states)
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            **{CACHE_FIELD: cache if use_cache or cache is not None else None},
        )

    def teacher_forced(self, forcing: Any) -> torch.Tensor:
        """Intermediate-layer distillation: each dense layer i (sublayers 2i, 2i+1: mixer, MLP) runs on the
        teacher's stream before its layer i, `forcing.layer_input(i)` `[B, T, D]`, not on the student's own; the
        result is the sum of `forcing.layer_loss(i, mixer output, layer output)` over the layers (the last
        layer's output after the final norm). `zebra.train.ild` is the `forcing`."""
        if len(self.layers) % 2:
            raise ValueError("ZebraModel: teacher forcing needs mixer/MLP sublayer pairs")
        num_layers = len(self.layers) // 2
        total = None
        for i in range(num_layers):
            x = forcing.layer_input(i)  # [B, T, D]
            positions = default_positions(x.shape[1], None, None, None, x.device)
            mixed, stream = self.layers[2 * i](x, None, position_ids=positions)  # mixer output, stream x
            out, stream = self.layers[2 * i + 1](mixed, stream, position_ids=positions)
            h = self.norm(out, stream) if i == num_layers - 1 else out + stream  # [B, T, D]
            loss = forcing.layer_loss(i, mixed, h)
            total = loss if total is None else total + loss
        return total


def default_positions(
    T: int,
    attention_mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    cache: ZebraCache | None,
    device: torch.device,
) -> torch.Tensor:
    """RoPE positions `[B or 1, T]` of the new tokens when the caller gives none."""
    if attention_mask is not None:
        # position = number of real tokens before this one (left padding does not shift positions)
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:].to(device)
    if cu_seqlens is not None:
        t = torch.arange(T, device=device)
        starts = cu_seqlens.to(device)[torch.searchsorted(cu_seqlens.to(device), t, right=True) - 1]
        return (t - starts)[None]
    if cache is not None:
        return cache.positions(T, device)
    return torch.arange(T, device=device)[None]


class ZebraForCausalLM(ZebraPreTrainedModel, GenerationMixin):
    """`ZebraModel` with a language-model head (tied to the embedding when `tie_word_embeddings`)."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {"lm_head.weight": "model.embeddings.weight"}

    def __init__(self, config: ZebraConfig):
        super().__init__(config)
        self.model = ZebraModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: ZebraCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        cu_seqlens: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: ZebraCache | None = None,
        shift_labels: torch.LongTensor | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        head_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        teacher_forcing: Any = None,
        **unused: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits `[B, T', V]` and, with `labels` or `shift_labels` `[B, T]`, the next-token loss (float32).

        Targets: `labels` are shifted inside (HF's meaning: position t is scored against `labels[:, t + 1]`);
        `shift_labels` are already aligned (position t against `shift_labels[:, t]`). -100 is ignored: with
        packed sequences mark each sequence's first token in `labels` (its last position in `shift_labels`) -100,
        so no token predicts across a boundary. The loss is the mean over the counted tokens, or their sum divided
        by `num_items_in_batch` when given (HF's gradient-accumulation convention; 1 gives the sum).

        In training mode with targets, the loss is `zebra_kernels.linear_cross_entropy` of the final hidden
        states and `lm_head.weight` (chunked over tokens: the `[B, T, V]` logits never exist, backend
        `config.kernel_backend`) and `logits` is None, as with FLA's fused linear cross entropy. In eval mode (or
        without targets) the logits are returned and the loss, if asked for, is computed from them.
        `logits_to_keep`: an int n keeps the last n positions (0 = all); a 1-D tensor keeps those positions.
        `head_loss`: instead of any target, a function of (final hidden states `[B, T, D]`, `lm_head.weight`
        `[V, D]`) whose value is the loss (no logits): a training loss that needs the head inside the forward,
        where FSDP has gathered it and DDP's hooks see it (distillation, `zebra.train.distill`).
        `teacher_forcing`: intermediate-layer distillation (`ZebraModel.teacher_forced`, `zebra.train.ild`): the
        loss is its per-layer loss and the other inputs are ignored; inside the forward for FSDP / DDP as above.
        Other arguments: see `ZebraModel.forward`.
        """
        if teacher_forcing is not None:
            return CausalLMOutputWithPast(loss=self.model.teacher_forced(teacher_forcing))
        if labels is not None and shift_labels is not None:
            raise ValueError("ZebraForCausalLM: pass labels or shift_labels, not both")
        if head_loss is not None and (labels is not None or shift_labels is not None):
            raise ValueError("ZebraForCausalLM: head_loss replaces labels / shift_labels; pass one")
        has_targets = labels is not None or shift_labels is not None
        if has_targets and not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
            raise ValueError(
                "ZebraForCausalLM: labels need the logits of every position; leave logits_to_keep=0"
            )
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache if cache is not None else past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            cu_seqlens=cu_seqlens,
            output_hidden_states=output_hidden_states,
        )
        if labels is not None:  # HF labels: position t against labels[:, t + 1], the last one against none
            shift_labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)  # [B, T]
        if head_loss is not None:
            logits, loss = None, head_loss(out.last_hidden_state, self.lm_head.weight)
        else:
            logits, loss = self._logits_and_loss(
                out.last_hidden_state, shift_labels, logits_to_keep, num_items_in_batch
            )
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
            **{CACHE_FIELD: getattr(out, CACHE_FIELD)},
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        return output if return_dict else output.to_tuple()

    def _logits_and_loss(
        self,
        hidden_states: torch.Tensor,
        shift_labels: torch.Tensor | None,
        logits_to_keep: int | torch.Tensor,
        num_items_in_batch: int | torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits, loss) from the final hidden states `[B, T, D]`: the fused loss and no logits in training
        with targets, else the kept logits `[B, T', V]` and the loss from them (see `forward`)."""
        reduction = "mean" if num_items_in_batch is None else "sum"
        logits = loss = None
        if shift_labels is not None and self.training:
            loss = linear_cross_entropy(
                hidden_states.flatten(0, 1),  # [B*T, D]
                self.lm_head.weight,  # [V, D]
                shift_labels.flatten(),  # [B*T]
                reduction=reduction,
                backend=self.config.kernel_backend,
            )
        else:
            if isinstance(logits_to_keep, int):
                kept = hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states
            else:
                kept = hidden_states[:, logits_to_keep.to(hidden_states.device)]
            logits = self.lm_head(kept)  # [B, T', V]
            if shift_labels is not None:
                loss = causal_lm_loss(logits, shift_labels, reduction=reduction)
        if loss is not None and num_items_in_batch is not None:
            loss = loss / num_items_in_batch
        return logits, loss


def causal_lm_loss(
    logits: torch.Tensor, shift_labels: torch.Tensor, *, reduction: str = "mean"
) -> torch.Tensor:
    """Cross entropy (float32; float64 for float64 logits) of `logits[:, t]` `[B, T, V]` against
    `shift_labels[:, t]` `[B, T]`, ignoring -100; `reduction` "mean" (over counted tokens) or "sum"."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        shift_labels.to(logits.device).reshape(-1),
        ignore_index=-100,
        reduction=reduction,
    )
