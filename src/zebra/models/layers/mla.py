"""Multi-Latent Attention (MLA), the `*` sublayer: DeepSeek-V2 / Megatron parameterisation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from zebra.models.layers.norm import RMSNorm
from zebra.models.layers.packed import Prenorm, decode_linear, decode_norm_linear, project
from zebra.models.layers.rotary import YarnRotaryEmbedding, yarn_softmax_scale
from zebra_kernels.rope import rope_qk

if TYPE_CHECKING:
    from zebra.models.cache_zebra import ZebraCache

# With a cache, chunks of at most this many new tokens attend in the weight-absorbed form over the latent cache.
ABSORB_MAX_T = 64


class MultiLatentAttention(nn.Module):
    """Multi-Latent Attention: queries and keys/values pass through low-rank latents; only the normalised
    key/value latent and one shared RoPE key per token are cached.

    Reference: `DeepSeek-V2 <https://arxiv.org/abs/2405.04434>`_ (section 2.1); Megatron `MLASelfAttention`.

    Per token (the latent RMSNorms are identities with `latent_norm=False`, as in the published upcycled
    students): `c_q = RMSNorm(q_down_proj x)`, `q = q_up_proj c_q` -> per head `[q_nope (dn) | q_rope (dr)]`;
    `[c_kv | k_rope] = kv_down_proj x`, `c_kv = RMSNorm(c_kv)`, `[k_nope (dn) | v (dv)] = kv_up_proj c_kv` per head;
    RoPE (YaRN) rotates q_rope and the shared k_rope; softmax scale `mscale^2 / sqrt(dn + dr)`.

    Parameters (q_lora_rank Rq > 0, kv_lora_rank Rkv, H heads; the `+ Rq` and `+ Rkv` are the latent norms):
        D*Rq + Rq + Rq*H*(dn+dr)  +  D*(Rkv+dr) + Rkv + Rkv*H*(dn+dv)  +  H*dv*D
    (1B: q 5.51M + kv_down 0.33M + kv_up 0.39M + o 4.19M + norms = 10,421,696).

    Decode cache per token: Rkv + dr values (the normalised latent and the roped shared key), never the
    expanded keys/values. Two equivalent attention forms:
      - expanded (training, prefill): `kv_up_proj` expands the latents to per-head k/v; `F.scaled_dot_product_attention`.
      - absorbed (decode, <= 64 new tokens with a cache): the key part of `kv_up_proj` is folded into the query
        (`q_nope W_uk` lives in latent space) and its value part into the output, so attention runs directly over
        the cached latents.

    Args:
        hidden_size: model width D.
        num_heads: attention heads H.
        q_lora_rank: query latent rank Rq (0 = a plain `q_proj`).
        kv_lora_rank: key/value latent rank Rkv.
        qk_nope_head_dim: per-head query/key channels without RoPE (dn).
        qk_rope_head_dim: per-head query/key channels with RoPE (dr; the key part is shared over heads).
        v_head_dim: per-head value channels (dv).
        rope: YaRN parameters (`ZebraConfig.rope_parameters`).
        norm_eps: epsilon of the latent RMSNorms.
        latent_norm: RMSNorms on the latents (False: `nn.Identity`, no parameters).
        use_rope: rotate q_rope / k_rope by position; False: NoPE, both used as they are and the softmax scale
            `1 / sqrt(dn + dr)` (Kimi-Linear's MLA).
        layer_idx: the sublayer index (its slot in the cache).
        backend: kernel backend of the latent norms and the cached decode attention ("auto", "torch", "fla").
    """

    # one GEMM for q_down_proj and kv_down_proj in training too (`zebra.models.layers.packed.project`)
    fuse_projections: bool = False
    fused_decode: bool = False  # `packed.use_fused_decode`: decode GEMVs on Zebra's kernels

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        q_lora_rank: int,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        rope: dict[str, Any],
        norm_eps: float = 1e-6,
        layer_idx: int | None = None,
        backend: str = "auto",
        latent_norm: bool = True,
        use_rope: bool = True,
    ):
        super().__init__()
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={qk_rope_head_dim} must be even")
        self.num_heads = num_heads
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.layer_idx = layer_idx
        self.backend = backend
        self.use_rope = use_rope
        qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        if q_lora_rank:
            self.q_down_proj = nn.Linear(hidden_size, q_lora_rank, bias=False)
            self.q_norm = (
                RMSNorm(q_lora_rank, eps=norm_eps, backend=backend) if latent_norm else nn.Identity()
            )
            self.q_up_proj = nn.Linear(q_lora_rank, num_heads * qk_head_dim, bias=False)
        else:
            self.q_proj = nn.Linear(hidden_size, num_heads * qk_head_dim, bias=False)
        self.kv_down_proj = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank, eps=norm_eps, backend=backend) if latent_norm else nn.Identity()
        self.kv_up_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=False)
        self.o_proj._is_residual_out = True
        self.rotary = YarnRotaryEmbedding(qk_rope_head_dim, rope)
        self.softmax_scale = yarn_softmax_scale(rope, qk_head_dim) if use_rope else qk_head_dim**-0.5

    @classmethod
    def from_config(cls, config: Any, layer_idx: int) -> MultiLatentAttention:
        """The `*` sublayer `layer_idx` of a `ZebraConfig` (its MLA keys and `rope_parameters`)."""
        c = config
        return cls(
            c.hidden_size, c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
            c.qk_rope_head_dim, c.v_head_dim, c.rope_parameters, norm_eps=c.rms_norm_eps, layer_idx=layer_idx,
            backend=c.kernel_backend, latent_norm=c.mla_latent_norm, use_rope=c.mla_rope,
        )  # fmt: skip

    def reset_parameters(self) -> None:
        """Nothing of its own: its Linears and latent norms keep their own (or the model's) initialisation, and
        RoPE has no parameters."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: ZebraCache | None = None,
        cu_seqlens: torch.Tensor | None = None,
        absorb: bool | None = None,
        memo: dict | None = None,
        prenorm: Prenorm | None = None,
        **unused: Any,
    ) -> torch.Tensor:
        """Attend causally over the cached and the new tokens.

        Args:
            hidden_states: `[B, T, D]`.
            position_ids: `[B, T]` (or `[1, T]`) RoPE positions of the new tokens.
            attention_mask: `[B, L]` 1 = real token, 0 = padding, over cached + new tokens (HF convention).
            cache: the model's `ZebraCache`; the new latents are appended to it.
            cu_seqlens: `[N + 1]` packed-sequence offsets (B == 1, no cache): attention stays inside each sequence.
            absorb: force the absorbed (True) or expanded (False) form; None picks absorbed for <= 64 new tokens
                with a cache.
            memo: the model forward's dict for what every MLA sublayer computes alike (RoPE's cos/sin, the
                attention mask): the first computes it, the others reuse it (fewer kernels per decode step).
            prenorm: the sublayer's pre-norm, still to apply to `hidden_states` by the first projection.

        Returns:
            `[B, T, D]`.
        """
        B, T, _ = hidden_states.shape
        H, dn, dr = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        q_in = "q_down_proj" if self.q_lora_rank else "q_proj"
        q, kv = project(
            self, hidden_states, (q_in, "kv_down_proj"), prenorm=prenorm
        )  # one GEMV while decoding
        if self.q_lora_rank:
            q = decode_norm_linear(self, self.q_norm, self.q_up_proj, q)
        q = q.view(B, T, H, dn + dr)
        q_nope, q_rope = q.split([dn, dr], dim=-1)  # [B, T, H, dn], [B, T, H, dr]
        latent, k_rope = kv.split([self.kv_lora_rank, dr], dim=-1)
        latent = self.kv_norm(latent)  # [B, T, Rkv]
        if self.use_rope:
            cos, sin = once(
                memo, ("rope", q.dtype), lambda: self.rotary(position_ids, q.dtype)
            )  # [B, T, dr / 2]
            # `torch_rotate_pairs` on both; one Triton launch on a GPU without gradients (zebra_kernels.rope)
            q_rope, k_rope = rope_qk(
                q_rope, k_rope, cos, sin, backend=self.backend
            )  # [B, T, H, dr], [B, T, dr]

        offset: int | torch.Tensor = 0
        if cache is not None:
            if cu_seqlens is not None:
                raise ValueError("MLA: packed sequences (cu_seqlens) cannot be combined with a decode cache")
            offset = cache.offset
            latent, k_rope = cache.update_latents(self.layer_idx, latent, k_rope)  # [B, L, Rkv], [B, L, dr]
        L = latent.shape[1]
        if absorb is None:
            absorb = cache is not None and T <= ABSORB_MAX_T
        if absorb and cache is not None and attention_mask is None:  # reads only the cached tokens
            o = self._absorbed_cached(q_nope, q_rope, latent, k_rope, offset + T, host_length(cache, T))
            return decode_linear(self, self.o_proj, o.reshape(B, T, H * self.v_head_dim))
        mask = once(
            memo,
            ("mask", L),
            lambda: attention_allowed(T, L, offset, attention_mask, cu_seqlens, hidden_states.device),
        )
        if absorb:
            o = self._absorbed(q_nope, q_rope, latent, k_rope, mask)
        else:
            o = self._expanded(q_nope, q_rope, latent, k_rope, mask)
        return decode_linear(self, self.o_proj, o.reshape(B, T, H * self.v_head_dim))

    def _expanded(self, q_nope, q_rope, latent, k_rope, mask) -> torch.Tensor:
        """Per-head keys/values from the latents; SDPA. Returns `[B, T, H, dv]`."""
        B, _, H, _ = q_nope.shape
        L = latent.shape[1]
        kv = self.kv_up_proj(latent).view(B, L, H, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)  # [B, L, H, dn], [B, L, H, dv]
        k = torch.cat([k_nope, k_rope[:, :, None].expand(B, L, H, self.qk_rope_head_dim)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)  # [B, T, H, dn + dr]
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # [B, H, T, dn + dr]
            k.transpose(1, 2),  # [B, H, L, dn + dr]
            v.transpose(1, 2),  # [B, H, L, dv]
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.softmax_scale,
        )
        return o.transpose(1, 2)  # [B, T, H, dv]

    def _absorbed_cached(self, q_nope, q_rope, latent, k_rope, lengths, max_length) -> torch.Tensor:
        """The absorbed form over the first `lengths` (`[]` device tensor or int) cache slots through
        `zebra_kernels.mla_decode` (one split-K Triton kernel and its merge on a GPU). Returns `[B, T, H, dv]`."""
        from zebra_kernels.mla_decode import mla_decode

        w_uk, w_uv = self._absorbed_weights()
        q_latent = torch.einsum("bthd,hdr->bthr", q_nope, w_uk)  # [B, T, H, Rkv]
        o_latent = mla_decode(
            q_latent, q_rope, latent, k_rope, lengths, self.softmax_scale, max_length=max_length,
            backend=self.backend,
        )  # fmt: skip
        return torch.einsum("bthr,hvr->bthv", o_latent, w_uv)  # [B, T, H, dv]

    def _absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`kv_up_proj`'s key and value parts per head: `[H, dn, Rkv]`, `[H, dv, Rkv]`."""
        H = self.num_heads
        w = self.kv_up_proj.weight.view(H, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)

    def _absorbed(self, q_nope, q_rope, latent, k_rope, mask) -> torch.Tensor:
        """Attention over the latents with `kv_up_proj` folded into query and output. Returns `[B, T, H, dv]`."""
        T, L = q_nope.shape[1], latent.shape[1]
        w_uk, w_uv = self._absorbed_weights()  # [H, dn, Rkv], [H, dv, Rkv]
        q_latent = torch.einsum("bthd,hdr->bhtr", q_nope, w_uk)  # [B, H, T, Rkv]
        scores = torch.einsum("bhtr,blr->bhtl", q_latent, latent)  # [B, H, T, L]
        scores = scores + torch.einsum("bthd,bld->bhtl", q_rope, k_rope)
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * self.softmax_scale
        if mask is None:
            mask = torch.ones(T, L, dtype=torch.bool, device=scores.device).tril(L - T)
        probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(latent.dtype)
        o_latent = torch.einsum("bhtl,blr->bthr", probs, latent)  # [B, T, H, Rkv]
        return torch.einsum("bthr,hvr->bthv", o_latent, w_uv)  # [B, T, H, dv]


def host_length(cache: ZebraCache, T: int) -> int | None:
    """A host bound on the cached tokens after T new ones (`seen_tokens` counts every fed step, so it is never
    below the device offset), or None while a CUDA graph is captured or the step is compiled: a bound read on
    the host then would be frozen into every replay."""
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    if capturing or torch.compiler.is_compiling():
        return None
    return cache.seen_tokens + T


def once(memo: dict | None, key: Any, make: Callable[[], Any]) -> Any:
    """`make()`, computed once per `memo` (the model forward's): every MLA sublayer shares the same rotary
    embedding and positions, so their cos/sin and mask are equal; without a memo, computed each time."""
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]


def attention_allowed(
    T: int,
    L: int,
    offset: int | torch.Tensor,
    attention_mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor | None:
    """Which keys each query may attend to: bool `[B or 1, 1, T, L]`, or None for plain causal (T == L).

    Query i sits at cache slot `offset + i`; key slot j is allowed when `j <= offset + i`, the key is not padding
    (`attention_mask`, shorter masks are zero-extended) and, with `cu_seqlens`, both lie in the same sequence. A
    query may always see its own slot, so padded queries get a finite (ignored) output instead of NaN.
    """
    plain = (
        attention_mask is None and cu_seqlens is None and T == L and isinstance(offset, int) and offset == 0
    )
    if plain:
        return None
    q_slot = offset + torch.arange(T, device=device)  # [T]
    k_slot = torch.arange(L, device=device)  # [L]
    allowed = k_slot[None, :] <= q_slot[:, None]  # [T, L]
    allowed = allowed[None, None]  # [1, 1, T, L]
    if attention_mask is not None:
        keys = attention_mask.to(device=device, dtype=torch.bool)[:, :L]  # [B, <=L]
        if keys.shape[1] < L:
            keys = F.pad(keys, (0, L - keys.shape[1]), value=False)
        allowed = allowed & keys[:, None, None, :]  # [B, 1, T, L]
    if cu_seqlens is not None:
        seq_id = torch.searchsorted(cu_seqlens.to(device), torch.arange(L, device=device), right=True)  # [L]
        allowed = allowed & (seq_id[:T, None] == seq_id[None, :])[None, None]
    return allowed | (k_slot[None, :] == q_slot[:, None])[None, None]
