"""Zebra's compute kernels behind one functional API: a torch reference that runs anywhere (naive recurrent and
chunked forms, with autograd) and FLA's Triton kernels on CUDA/ROCm GPUs.

Tensors use FLA's layout `[B, T, H, D]`; recurrent states are float32 (float64 for float64 inputs); every op
takes `initial_state`, `output_final_state`, packed sequences through `cu_seqlens`, and
`backend="auto" | "torch" | "fla"`. See docs/kernels.md.
"""

from zebra_kernels.backend import resolve_backend
from zebra_kernels.conv import causal_conv1d, causal_conv1d_step_
from zebra_kernels.delta_rule.gdn import gated_delta_rule, gdn_gate
from zebra_kernels.delta_rule.kda import kda_gate, kimi_delta_rule
from zebra_kernels.gemv import gated_rms_norm_linear, linear_rows, rms_norm_linear
from zebra_kernels.loss import linear_cross_entropy
from zebra_kernels.mamba2 import mamba2_ssd, mamba2_ssd_step
from zebra_kernels.norm import rms_norm, rms_norm_gated
from zebra_kernels.swiglu import swiglu_linear

__all__ = [
    "causal_conv1d",
    "causal_conv1d_step_",
    "gated_delta_rule",
    "gated_rms_norm_linear",
    "gdn_gate",
    "kda_gate",
    "kimi_delta_rule",
    "linear_cross_entropy",
    "linear_rows",
    "mamba2_ssd",
    "mamba2_ssd_step",
    "resolve_backend",
    "rms_norm",
    "rms_norm_gated",
    "rms_norm_linear",
    "swiglu_linear",
]
