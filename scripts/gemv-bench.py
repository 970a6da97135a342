"""Zebra's decode GEMV kernel (`zebra_kernels.gemv`) against cuBLAS at a 1B model's decode shapes, one GPU:

    python3 scripts/gemv-bench.py [--batch 1,8] [--json]

Per shape and batch: the unfused torch path as a decode step runs it (cuBLAS GEMVs; for the MLP, the pre-norm,
gate, up and SwiGLU kernels too; for an output projection after a gated norm, that norm's kernel) and the fused kernel (its launch config tuned first, as the engine's warm-up
does), each the median of 200 CUDA-event timings of 20 launches; GB/s of the weights read, and the same as a
share of a large device-to-device copy's bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

D, F_MLP = 2048, 8192  # 1b recipes: hidden, MLP width
SHAPES = {  # name: (N, K, the fused form); from the 1b-mamba-mla and 1b-gdn-pure recipes
    "mlp gate+up (norm, SwiGLU)": (F_MLP, D, "norm-swiglu"),
    "mlp down": (D, F_MLP, "plain"),
    "mamba2 in_proj": (5152, D, "plain"),
    "mamba2 out_proj, mla o_proj": (D, D, "plain"),
    "mamba2 out_proj (gated group norm)": (D, D, "gated-256"),
    "mla q_up_proj": (D, 1344, "plain"),
    "mla q + kv down, stacked": (1344 + 160, D, "plain"),
    "gdn q,k,v,b,a,g, stacked": (3104, D, "plain"),
    "gdn o_proj": (D, 1024, "plain"),
    "gdn o_proj (gated head norm)": (D, 1024, "gated-64"),
}


def median_us(fn, launches: int = 20, repeats: int = 200) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (median_us(lambda: b.copy_(a), launches=5, repeats=20) * 1e-6)


def main() -> None:
    from zebra_kernels import gated_rms_norm_linear, linear_rows, rms_norm, rms_norm_gated, rms_norm_linear

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    rows = []
    with torch.no_grad():
        for name, (n, k, form) in SHAPES.items():
            w, up = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(2))
            norm_w = torch.ones(k, device="cuda", dtype=torch.bfloat16)
            for batch in (int(b) for b in args.batch.split(",")):
                x, res = (torch.randn(batch, 1, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                if form == "norm-swiglu":
                    weight_bytes = 2 * w.numel() * w.element_size()

                    def unfused(x=x, res=res, w=w, up=up, norm_w=norm_w):
                        h, _ = rms_norm(x, norm_w, eps=1e-6, residual=res, prenorm=True)
                        return F.silu(F.linear(h, w)) * F.linear(h, up)

                    def fused(x=x, res=res, w=w, up=up, norm_w=norm_w):
                        return rms_norm_linear(x, norm_w, w, eps=1e-6, residual=res, up_weight=up)
                elif form.startswith("gated"):
                    weight_bytes, segment = w.numel() * w.element_size(), int(form.split("-")[1])
                    z, gw = (
                        res,
                        torch.ones(segment if segment == 64 else k, device="cuda", dtype=torch.bfloat16),
                    )
                    group, before = (None, True) if segment == 64 else (segment, False)

                    def unfused(x=x, z=z, w=w, gw=gw, group=group, before=before):
                        c = gw.shape[0]
                        n = rms_norm_gated(x.unflatten(-1, (-1, c)), z.unflatten(-1, (-1, c)), gw, eps=1e-5,
                                           group_size=group, norm_before_gate=before)  # fmt: skip
                        return F.linear(n.flatten(-2), w)

                    def fused(x=x, z=z, w=w, gw=gw, group=group, before=before):
                        return gated_rms_norm_linear(
                            x, z, gw, w, eps=1e-5, group_size=group, norm_before_gate=before
                        )
                else:
                    weight_bytes = w.numel() * w.element_size()

                    def unfused(x=x, w=w):
                        return F.linear(x, w)

                    def fused(x=x, w=w):
                        return linear_rows(x, w)

                base_us, fused_us = median_us(unfused), median_us(fused)
                row = {
                    "shape": name,
                    "N": n,
                    "K": k,
                    "batch": batch,
                    "cublas_us": round(base_us, 2),
                    "zebra_us": round(fused_us, 2),
                    "speedup": round(base_us / fused_us, 3),
                    "cublas_of_copy": round(weight_bytes / (base_us * 1e-6) / bandwidth, 3),
                    "zebra_of_copy": round(weight_bytes / (fused_us * 1e-6) / bandwidth, 3),
                }
                rows.append(row)
                print(json.dumps(row) if args.json else row, flush=True)
    print(json.dumps({"device": torch.cuda.get_device_name(), "copy_gb_s": round(bandwidth / 1e9, 1)}))


if __name__ == "__main__":
    main()
