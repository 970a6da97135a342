"""Mamba2 SSD on mamba-ssm's chunked Triton kernel (`mamba_chunk_scan_combined`), GPU only, no CUDA build needed.

mamba-ssm computes `mamba2_ssd`'s recurrence itself, with grouped B/C and the D skip inside the kernel; its state
layout is `[N, H, P, N_state]` (ours `[N, H, N_state, P]`: transposed on the way in and out). Packed sequences
without states run in one launch with `seq_idx` (the state is reset at each boundary); packed sequences with an
initial or a final state run as a zero-padded batch, because mamba-ssm takes one initial state per row and has
no backward for its per-sequence final states.
"""

from __future__ import annotations

import torch

from zebra_kernels._torch_driver import run_varlen
from zebra_kernels.backend import as_fla_float, mamba_ssm_ssd_module

# Time steps per chunk of the scan: mamba-ssm's Mamba2 default (Megatron's MambaMixer uses 128). `zebra bench ssd`
# times both at the 1B shapes.
CHUNK_SIZE = 256


def mamba_ssm_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    *,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as `zebra_kernels.mamba2_ssd` (D included); returns y `[B, T, H, P]` in x's dtype and the final
    state `[N_seq, H, N, P]` (float32) or None."""
    scan = mamba_ssm_ssd_module().mamba_chunk_scan_combined
    x, dt, A, D = (as_fla_float(t) for t in (x, dt, A, D))
    B, C = B.to(x.dtype), C.to(x.dtype)
    if cu_seqlens is not None and initial_state is None and not output_final_state:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(x.device)  # [N_seq]
        seq_ids = torch.arange(lengths.numel(), device=x.device, dtype=torch.int32)
        seq_idx = seq_ids.repeat_interleave(lengths, output_size=x.shape[1])[None]  # [1, T]
        return scan(x, dt, A, B, C, chunk_size, D=D, seq_idx=seq_idx), None

    def rows(x, dt, B, C, initial_state):
        h0 = None if initial_state is None else initial_state.float().transpose(-1, -2)  # [N, H, P, N_state]
        out = scan(x, dt, A, B, C, chunk_size, D=D, initial_states=h0, return_final_states=output_final_state)
        if not output_final_state:
            return out, None
        y, state = out
        return y, state.transpose(-1, -2).contiguous()  # [N, H, N_state, P]

    return run_varlen(rows, [x, dt, B, C], initial_state, cu_seqlens)
