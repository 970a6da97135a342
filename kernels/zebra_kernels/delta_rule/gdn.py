"""Gated DeltaNet (GDN): `gated_delta_rule` (one log decay per value head) and its gate `gdn_gate`; the shared
delta-rule driver is this package's `__init__`, its torch forms `naive` and `chunk`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zebra_kernels._common import compute_dtype
from zebra_kernels.delta_rule import DeltaRuleVariant, delta_rule

__all__ = ["gated_delta_rule", "gdn_gate"]


def gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None = None) -> torch.Tensor:
    """GDN log decay from the raw `a_proj` output: `-exp(A_log) * softplus(a + dt_bias)`, in float32/64.

    Args:
        a: `[B, T, HV]`. A_log, dt_bias: `[HV]`.
    """
    dtype = compute_dtype(a, A_log, dt_bias)
    a = a.to(dtype) if dt_bias is None else a.to(dtype) + dt_bias.to(dtype)
    return -A_log.to(dtype).exp() * F.softplus(a)


GDN = DeltaRuleVariant("GDN", per_channel=False, gate=gdn_gate)


def gated_delta_rule(
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
    r"""Gated delta rule (Gated DeltaNet), FLA semantics, with grouped value heads (GVA).

    `S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`, `o_t = S_t^T (scale q_t)`, per value
    head; value head j reads q/k head `j // (HV // H)`.

    Args:
        q: queries `[B, T, H, K]`.
        k: keys `[B, T, H, K]`.
        v: values `[B, T, HV, V]`, HV a multiple of H.
        g: log decay `[B, T, HV]` (<= 0), or the raw `a_proj` output when `use_gate_in_kernel=True`.
        beta: write strength `[B, T, HV]` (already through sigmoid, or its logits with
            `use_beta_sigmoid_in_kernel`).
        scale: multiplies q; default `K ** -0.5`.
        initial_state: `[N, HV, K, V]` (N = B, or the number of packed sequences); None means zeros.
        output_final_state: also return the final state `[N, HV, K, V]`.
        cu_seqlens: `[N + 1]` int offsets of packed sequences (then B == 1); no state crosses a boundary.
        use_qk_l2norm: L2-normalise q and k first (`x / sqrt(sum x^2 + 1e-6)`, FLA's l2norm).
        use_gate_in_kernel: `g` is raw; the decay is `-exp(A_log) * softplus(g + dt_bias)` (as FLA's layer).
        A_log: `[HV]`, needed with `use_gate_in_kernel`. dt_bias: `[HV]` or None.
        use_beta_sigmoid_in_kernel: `beta` holds logits; the kernel uses `sigmoid(beta)` (as FLA's layers).
        allow_neg_eigval: with `use_beta_sigmoid_in_kernel`, `2 * sigmoid(beta)`, in (0, 2).
        mode: "chunk", "recurrent" or "auto" (recurrent when T <= 64 and no grad is needed, else chunk).
        chunk_size: chunk length of the torch chunk form (FLA uses its own).
        backend: "auto", "torch" or "fla" (see `resolve_backend`).

    Returns:
        o `[B, T, HV, V]` in v's dtype, and the final state `[N, HV, K, V]` (float32; float64 when the inputs
        are float64) or None.

    Examples:
        >>> B, T, H, HV, K, V = 2, 100, 2, 4, 16, 16
        >>> q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
        >>> v = torch.randn(B, T, HV, V)
        >>> g = F.logsigmoid(torch.randn(B, T, HV))
        >>> beta = torch.rand(B, T, HV)
        >>> o, state = gated_delta_rule(q, k, v, g, beta, output_final_state=True)
        >>> o.shape, state.shape
        (torch.Size([2, 100, 4, 16]), torch.Size([2, 4, 16, 16]))
    """
    return delta_rule(
        GDN, q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
        dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        mode=mode, chunk_size=chunk_size, backend=backend,
    )  # fmt: skip
