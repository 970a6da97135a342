"""Recurrent mixers from attention: the teacher's Q/K/V/O projections copied into Mamba2, GDN, KDA and GLA
(each mixer's upcycle adapter, `zebra.mixers.<name>`, names its copy here).

In every recurrent mixer the query-like, key-like and value-like inputs play the roles of attention's q, k and
v (state S = sum of decayed k v^T, output S^T q), so they start as W_q, W_k, W_v, and the output projection as
W_o. The student has one key/value head per query head: each KV head's rows are repeated for the H / Hkv query
heads of its group. What attention has no counterpart for (gates, decay, convolutions, norms) keeps the
mixer's own initialisation.

    Mamba2  in_proj rows [z | x | B | C | dt]: x <- W_v, B <- W_k (repeated, ngroups = H), C <- W_q; out_proj <- W_o
            (published Zebra-Llama recipe, in Megatron's layout with one B/C group per head)
    GDN     q_proj <- W_q, k_proj <- W_k, v_proj <- W_v (repeated), o_proj <- W_o (Primus' hybrid upcycling)
    KDA     the same copy as GDN (no published recipe)
    GLA     the same copy (GLA is gated linear attention: S = sum of decayed k v^T, o = S^T q exactly)
"""

from __future__ import annotations

import torch

from zebra.upcycle.attention import Made, TeacherAttention
from zebra.upcycle.report import ASSEMBLED, COPIED, INITIALISED, REPEATED, TensorOrigin


def _maker(prefix: str, dtype: torch.dtype, init: dict[str, torch.Tensor], out: dict[str, Made]):
    def put(name: str, tensor: torch.Tensor, how: str, source: str = "", detail: str = "") -> None:
        full = prefix + name
        out[full] = (
            tensor.to(dtype).contiguous(),
            TensorOrigin(full, list(tensor.shape), how, source, detail),
        )

    def keep(name: str) -> None:
        put(name, init[prefix + name], INITIALISED, "", "the mixer's own initialisation")

    return put, keep


def qkvo_from_attention(
    attn: TeacherAttention, init: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype
) -> dict[str, Made]:
    """A mixer with `q_proj`, `k_proj`, `v_proj`, `o_proj` (GDN, KDA, GLA; `init`: the freshly initialised
    mixer's tensors, full names): q/k/v/o from the teacher, the rest its own initialisation."""
    out: dict[str, Made] = {}
    put, keep = _maker(prefix, dtype, init, out)
    repeat = f"each KV head x{attn.shape.queries_per_kv} (one per query head)"
    put("q_proj.weight", attn.q, COPIED, attn.source("q"))
    put("k_proj.weight", attn.repeated("k"), REPEATED, attn.source("k"), repeat)
    put("v_proj.weight", attn.repeated("v"), REPEATED, attn.source("v"), repeat)
    put("o_proj.weight", attn.o, COPIED, attn.source("o"))
    for name in init:
        if name.startswith(prefix) and name not in out:
            keep(name[len(prefix) :])
    return out


def mamba2_from_attention(
    attn: TeacherAttention, init: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype
) -> dict[str, Made]:
    """Mamba2 in Megatron's layout with ngroups = heads = H, head_dim = state = Dh (see the module docstring)."""
    out: dict[str, Made] = {}
    put, keep = _maker(prefix, dtype, init, out)
    s = attn.shape
    inner = s.num_heads * s.head_dim
    in_proj = init[prefix + "in_proj.weight"].clone()  # [2*Di + 2*G*N + H, D], G*N = Di = H*Dh
    _z, x, b, c, _dt = in_proj.split([inner, inner, inner, inner, s.num_heads])  # z and dt keep their init
    x.copy_(attn.repeated("v"))  # the splits are views: this writes into in_proj
    b.copy_(attn.repeated("k"))
    c.copy_(attn.q)
    rep = f"x{s.queries_per_kv}"
    blocks = (
        f"rows [z {inner}: initialised | x {inner}: v_proj {rep} | B {inner}: k_proj {rep} | "
        f"C {inner}: q_proj | dt {s.num_heads}: initialised]"
    )
    sources = ", ".join(attn.source(p) for p in "vkq")
    put("in_proj.weight", in_proj, ASSEMBLED, sources, blocks)
    put("out_proj.weight", attn.o, COPIED, attn.source("o"))
    for name in init:
        if name.startswith(prefix) and name not in out:
            keep(name[len(prefix) :])
    return out
