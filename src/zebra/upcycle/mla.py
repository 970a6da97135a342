"""MLA from GQA: the published Zebra-Llama initialisation (truncated SVDs in float32).

Per layer, with the teacher's W_q [H*Dh, D], W_k, W_v [Hkv*Dh, D], ranks r_q, r_kv and rope dim dr
(dn = Dh - dr no-RoPE channels per head):

    Q alone        W_q = U S V^T:            q_down = S[:r_q] V^T[:r_q]   q_up = U[:, :r_q]
    K, V jointly   [W_k; W_v] = U S V^T:     latent = S[:r_kv] V^T[:r_kv]
                   kv_up, head h of KV group g: [U_k(g)[:dn] ; U_v(g)] (the rows of U[:, :r_kv] of g's K
                   block that carry no RoPE, then all of g's V block), repeated to every query head of g
    RoPE key       the mean over KV heads of each W_k head's RoPE rows: one key shared by all heads
    kv_down        [latent ; rope key]
    o_proj         W_o, copied;  q_norm, kv_norm (the latent RMSNorms, when the student has them): ones

With the second moment C [D, D] of the layer's attention input on calibration text (`zebra upcycle --svd
activation`, zebra.upcycle.calibration), each SVD is of W L instead of W (C = L L^T, Cholesky): the kept rank then
minimises the error of W x on the teacher's inputs, and the factors are U[:, :r] and U[:, :r]^T W (with L = I, the
plain factors above). By default the student has no latent norms (the published form: all of S in the down
factor); with `--latent-norm` they start at ones (docs/upcycle.md measures what each part costs).

The rows of each query/key head are first put in the student's order [no-RoPE channels | RoPE channels], the
RoPE channels as the teacher's fastest rotation pairs in the student's MLA layout (`rope_rows`). This part is approximate: the
student's RoPE runs on dr channels with its own frequencies, the RoPE key is shared by all heads, the latent
norms rescale each token, and the ranks truncate.
"""

from __future__ import annotations

import torch

from zebra.upcycle.attention import Made, TeacherAttention
from zebra.upcycle.report import COPIED, INITIALISED, MEAN, SVD, TensorOrigin


def rope_rows(head_dim: int, rope_dim: int) -> list[int]:
    """The rows of a teacher head that become the student's RoPE channels, in the student's order.

    The teacher's head is in HF's rotate-half layout: row j rotates with row j + Dh/2 at frequency
    theta^(-2j/Dh), j = 0 .. Dh/2 - 1. The student's RoPE channels rotate in Megatron's MLA layout: channels
    (2i, 2i+1) together at theta^(-2i/dr) (`zebra.models.layers.rotary`). The dr/2 fastest teacher pairs
    (j = 0 .. dr/2 - 1) keep their rotation: they carry the position, while the slow pairs, which hardly turn
    over short distances, become no-RoPE channels. With dr = Dh this is the teacher's rotation exactly; with
    dr < Dh pair j turns at theta^(-2j/dr) instead of theta^(-2j/Dh). On SmolLM2-135M this starts lower than
    the published last-rows choice at full and default ranks (docs/upcycle.md).
    """
    half = head_dim // 2
    return [row for j in range(rope_dim // 2) for row in (j, j + half)]


def head_order(head_dim: int, rope_dim: int) -> list[int]:
    """Per-head row order of the student: the no-RoPE rows (ascending), then `rope_rows`."""
    rope = rope_rows(head_dim, rope_dim)
    return [r for r in range(head_dim) if r not in rope] + rope


def _reorder_heads(w: torch.Tensor, head_dim: int, order: list[int]) -> torch.Tensor:
    """Rows of every head of `w` [heads*Dh, D] in `order`."""
    heads = w.view(-1, head_dim, w.shape[-1])  # [heads, Dh, D]
    return heads[:, order].reshape(w.shape)


# The damping added to C's diagonal, relative to its mean, before the Cholesky factorisation.
MOMENT_DAMPING = 1e-4


def whitening(moment: torch.Tensor) -> torch.Tensor:
    """L [D, D] float64 with L L^T = C + damping: the Cholesky factor of a second moment (`moment` [D, D])."""
    c = moment.double()
    c = c + MOMENT_DAMPING * c.diagonal().mean() * torch.eye(c.shape[0], dtype=c.dtype)
    return torch.linalg.cholesky(c)


def truncated_svd(
    w: torch.Tensor, rank: int, whiten: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(U[:, :r] [rows, r], U[:, :r]^T W [r, cols], energy kept) of `w`, float32 results.

    Without `whiten`, U S V^T is the SVD of W (U^T W = S V^T) and the energy is the share of its squared singular
    values kept; with `whiten` (L from `whitening`), of W L, and the energy is the share of E||W x||^2 kept.
    """
    if whiten is None:
        u, s, vh = torch.linalg.svd(w.float(), full_matrices=False)
        down = s[:rank, None] * vh[:rank]
    else:
        u, s, _ = torch.linalg.svd(w.double() @ whiten, full_matrices=False)
        down = u[:, :rank].T @ w.double()
    energy = float((s[:rank] ** 2).sum() / (s**2).sum())
    return u[:, :rank].float(), down.float(), energy


def mla_from_gqa(
    attn: TeacherAttention, prefix: str, cfg, dtype: torch.dtype, moment: torch.Tensor | None = None
) -> dict[str, Made]:
    """The MLA tensors of one sublayer (names under `prefix`, e.g. `model.layers.4.mixer.`) from the teacher's
    attention; `cfg` is the student's ZebraConfig; `moment` the second moment of the attention's input on
    calibration text, for the activation-aware SVD."""
    s = attn.shape
    whiten = whitening(moment) if moment is not None else None
    dh, dn, dr = s.head_dim, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    order = head_order(dh, dr)
    q = _reorder_heads(attn.q, dh, order)  # [H*Dh, D], each head [nope | rope]
    k = _reorder_heads(attn.k, dh, order)  # [Hkv*Dh, D]
    out: dict[str, Made] = {}

    def put(name: str, tensor: torch.Tensor, how: str, source: str, detail: str = "", **extra) -> None:
        origin = TensorOrigin(prefix + name, list(tensor.shape), how, source, detail, **extra)
        out[prefix + name] = (tensor.to(dtype).contiguous(), origin)

    heads_reordered = f"rows of each head reordered [nope {dn} | rope {dr}]"
    if cfg.q_lora_rank:
        q_up, q_down, energy = truncated_svd(q, cfg.q_lora_rank, whiten)
        detail = _svd_detail(cfg.q_lora_rank, energy, whiten is not None)
        put("q_down_proj.weight", q_down, SVD, attn.source("q"), detail, rank=cfg.q_lora_rank, energy=energy)
        if cfg.mla_latent_norm:
            put("q_norm.weight", torch.ones(cfg.q_lora_rank), INITIALISED, "", "RMSNorm weight 1")
        put("q_up_proj.weight", q_up, SVD, attn.source("q"), f"{detail}; {heads_reordered}",
            rank=cfg.q_lora_rank, energy=energy)  # fmt: skip
    else:
        put("q_proj.weight", q, COPIED, attn.source("q"), heads_reordered)

    kv_rank = cfg.kv_lora_rank
    kv_sources = f"{attn.source('k')}, {attn.names['v']}"
    u, latent, energy = truncated_svd(torch.cat([k, attn.v]), kv_rank, whiten)  # u [2*Hkv*Dh, r]
    rope_key = k.float().view(s.num_kv_heads, dh, -1)[:, dn:].mean(dim=0)  # [dr, D]
    u_k, u_v = u.view(2, s.num_kv_heads, dh, kv_rank)  # [Hkv, Dh, r] each
    per_kv_head = torch.cat([u_k[:, :dn], u_v], dim=1)  # [Hkv, dn + Dh, r]
    kv_up = per_kv_head.repeat_interleave(s.queries_per_kv, dim=0).reshape(-1, kv_rank)  # [H*(dn+Dh), r]
    detail = _svd_detail(kv_rank, energy, whiten is not None)
    put("kv_down_proj.weight", torch.cat([latent, rope_key]), SVD, kv_sources,
        f"{detail}; last {dr} rows: {MEAN} over {s.num_kv_heads} KV heads of the rope rows of k_proj",
        rank=kv_rank, energy=energy)  # fmt: skip
    if cfg.mla_latent_norm:
        put("kv_norm.weight", torch.ones(kv_rank), INITIALISED, "", "RMSNorm weight 1")
    put("kv_up_proj.weight", kv_up, SVD, kv_sources,
        f"{detail}; per head [k nope {dn} | v {dh}], repeated x{s.queries_per_kv} per query group",
        rank=kv_rank, energy=energy)  # fmt: skip
    put("o_proj.weight", attn.o, COPIED, attn.names["o"])
    return out


def _svd_detail(rank: int, energy: float, activation: bool = False) -> str:
    if activation:
        return f"activation-aware SVD rank {rank}, {100 * energy:.2f}% of the output energy on the calibration text"
    return f"SVD rank {rank}, {100 * energy:.2f}% of the energy"
