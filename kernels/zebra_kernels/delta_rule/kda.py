"""Kimi Delta Attention (KDA): `kimi_delta_rule` (one log decay per key channel) and its gate `kda_gate`; the
shared delta-rule driver is this package's `__init__`, its torch forms `naive` and `chunk`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zebra_kernels._common import compute_dtype
from zebra_kernels.delta_rule import DeltaRuleVariant, delta_rule

__all__ = ["kda_gate", "kimi_delta_rule"]


def kda_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None = None) -> torch.Tensor:
    """KDA log decay from the raw `f_proj` output: `-exp(A_log[h]) * softplus(f + dt_bias.view(H, K))`
    (FLA's `naive_kda_gate`), in float32/64.

    Args:
        f: `[B, T, H, K]`. A_log: `[H]`. dt_bias: `[H * K]` or None.
    """
    H, K = f.shape[-2:]
    dtype = compute_dtype(f, A_log, dt_bias)
    f = f.to(dtype) if dt_bias is None else f.to(dtype) + dt_bias.to(dtype).view(H, K)
    return -A_log.to(dtype).view(H, 1).exp() * F.softplus(f)


KDA = DeltaRuleVariant("KDA", per_channel=True, gate=kda_gate)


def kimi_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    mode: str = "auto",
    chunk_size: int = 64,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""Kimi delta rule (KDA), FLA 0.6.0 `fla.ops.kda` semantics.

    `S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T`, `o_t = S_t^T (scale q_t)`,
    per value head; as in FLA, value heads may be grouped (head j reads q/k head `j // (HV // H)`).

    Args:
        q: queries `[B, T, H, K]`.
        k: keys `[B, T, H, K]`.
        v: values `[B, T, HV, V]` (HV == H for plain KDA).
        g: per-channel log decay `[B, T, HV, K]` (<= 0, already activated, FLA's default), or the raw
            `f_proj` output when `use_gate_in_kernel=True`.
        beta: write strength `[B, T, HV]` (already through sigmoid, or its logits with
            `use_beta_sigmoid_in_kernel`).
        scale: multiplies q; default `K ** -0.5`.
        initial_state: `[N, HV, K, V]` (N = B, or the number of packed sequences); None means zeros.
        output_final_state: also return the final state `[N, HV, K, V]`.
        cu_seqlens: `[N + 1]` int offsets of packed sequences (then B == 1); no state crosses a boundary.
        use_qk_l2norm: L2-normalise q and k first (`x / sqrt(sum x^2 + 1e-6)`, FLA's l2norm).
        use_gate_in_kernel: `g` is raw; the decay is `-exp(A_log[h]) * softplus(g + dt_bias.view(HV, K))`.
        A_log: `[HV]`, needed with `use_gate_in_kernel`. dt_bias: `[HV * K]` or None.
        use_beta_sigmoid_in_kernel: `beta` holds logits; the kernel uses `sigmoid(beta)` (as FLA's layers).
        allow_neg_eigval: with `use_beta_sigmoid_in_kernel`, `2 * sigmoid(beta)`, in (0, 2).
        mode: "chunk", "recurrent" or "auto" (recurrent when T <= 64 and no grad is needed, else chunk).
        chunk_size: chunk length of the torch chunk form (FLA uses its own).
        backend: "auto", "torch" or "fla" (see `resolve_backend`).

    Returns:
        o `[B, T, HV, V]` in v's dtype, and the final state `[N, HV, K, V]` (float32; float64 when the inputs
        are float64) or None.

    Examples:
        >>> B, T, H, K, V = 2, 100, 2, 8, 16
        >>> q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
        >>> g = F.logsigmoid(torch.randn(B, T, H, K))
        >>> beta = torch.rand(B, T, H)
        >>> o, state = kimi_delta_rule(q, k, v, g, beta, output_final_state=True)
        >>> o.shape, state.shape
        (torch.Size([2, 100, 2, 16]), torch.Size([2, 2, 8, 16]))
    """
    return delta_rule(
        KDA, q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
        dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        mode=mode, chunk_size=chunk_size, backend=backend,
    )  # fmt: skip
