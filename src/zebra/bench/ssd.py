"""`zebra bench ssd`: the Mamba2 scan (`zebra_kernels.mamba2_ssd`) on each GPU backend at a recipe's shapes, forward
and forward + backward, and which one `backend="auto"` should run.

What is measured: one Mamba2 sublayer's scan as the model calls it in bf16 training: x, B, C in bf16 (after the
short convolution), dt (after softplus), A and D in float32, all requiring gradients, a random bf16 cotangent on
y. Each row runs `warmup` untimed calls (Triton autotuning), then the median of `repeats` timed calls (CUDA
events) of the forward alone and of forward + backward (`torch.autograd.grad`). Rows: FLA's simple-GLA path
(`backend="fla"`) and mamba-ssm's `mamba_chunk_scan_combined` at each chunk size of `MAMBA_SSM_CHUNKS`. Each row's
output is compared with FLA's (relative error) to show they compute the same scan; a row that fails keeps its
error and the others still run.

`auto` runs `zebra_kernels.backend.SSD_AUTO_CHUNK_BACKEND` for the chunked scan; the report names the faster row
and the one-line change that makes `auto` take it. The scan alone is a hint, not the decision: `auto` follows
the whole training step (`zebra bench train`), where the two have disagreed (docs/benchmarks.md, "Mamba2 scan").
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from zebra.core.errors import ZebraError
from zebra.mixers import MAMBA2
from zebra.recipes import load_recipe
from zebra.spec import arch

MAMBA_SSM_CHUNKS = (128, 256)  # Megatron's MambaMixer chunk, mamba-ssm's Mamba2 default


@dataclass
class SsdBenchRow:
    backend: str  # "fla" or "mamba_ssm"
    chunk_size: int | None  # mamba-ssm's chunk; None for FLA (it picks its own)
    forward_ms: float | None
    forward_backward_ms: float | None
    rel_err_vs_fla: float | None  # ||y - y_fla|| / ||y_fla||
    error: str | None = None  # why the row has no timings


@dataclass
class SsdBenchReport:
    recipe: str
    device: str
    batch: int
    seq_len: int
    heads: int
    head_dim: int
    groups: int
    state_dim: int
    mamba_sublayers: int  # Mamba2 sublayers in the recipe: a training step runs this many scans
    auto: str  # what backend="auto" runs today (SSD_AUTO_CHUNK_BACKEND)
    auto_chunk: int  # mamba-ssm's chunk size today (zebra_kernels.mamba2.mamba_ssm_backend.CHUNK_SIZE)
    rows: list[SsdBenchRow]

    @property
    def fastest(self) -> SsdBenchRow | None:
        """The timed row with the smallest forward + backward time."""
        timed = [r for r in self.rows if r.forward_backward_ms is not None]
        return min(timed, key=lambda r: r.forward_backward_ms) if timed else None

    @property
    def advice(self) -> str:
        """What to set so that `auto` runs the fastest row (empty when it already does)."""
        best = self.fastest
        if best is None:
            return ""
        changes = []
        if best.backend != self.auto:
            changes.append(f"SSD_AUTO_CHUNK_BACKEND = {best.backend!r} in kernels/zebra_kernels/backend.py")
        if best.chunk_size is not None and best.chunk_size != self.auto_chunk:
            changes.append(
                f"CHUNK_SIZE = {best.chunk_size} in kernels/zebra_kernels/mamba2/mamba_ssm_backend.py"
            )
        return " and ".join(changes)

    def to_dict(self) -> dict[str, Any]:
        best = self.fastest
        return {**asdict(self), "fastest": None if best is None else asdict(best), "advice": self.advice}


def ssd_bench_inputs(
    batch: int, seq_len: int, heads: int, head_dim: int, groups: int, state_dim: int, device
):
    """x `[B, T, H, P]` bf16, dt `[B, T, H]` fp32, A `[H]` fp32, B, C `[B, T, G, N]` bf16, D `[H]` fp32 (leaves
    requiring grad), and a bf16 cotangent `[B, T, H, P]`."""
    import torch

    from zebra_kernels.testing import ssd_inputs

    x, dt, A, B, C, D, _ = ssd_inputs(batch, seq_len, heads, head_dim, groups, state_dim, device=device)
    dtypes = (torch.bfloat16, torch.float32, torch.float32, torch.bfloat16, torch.bfloat16, torch.float32)
    leaves = [t.to(d).requires_grad_() for t, d in zip((x, dt, A, B, C, D), dtypes, strict=True)]
    gen = torch.Generator(device=device).manual_seed(1)
    d_y = torch.randn(x.shape, generator=gen, device=device).to(torch.bfloat16)
    return leaves, d_y


def median_ms(fn: Callable[[], Any], warmup: int, repeats: int) -> float:
    """Median CUDA-event time of `fn()` in milliseconds after `warmup` untimed calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _scans(leaves, chunk_sizes: Sequence[int]) -> list[tuple[str, int | None, Callable[[], Any]]]:
    """(backend, chunk, scan) per row, mamba-ssm at each of `chunk_sizes`; each scan returns y `[B, T, H, P]`."""
    import zebra_kernels as zk

    x, dt, A, B, C, D = leaves

    def fla():
        return zk.mamba2_ssd(x, dt, A, B, C, D=D, mode="chunk", backend="fla")[0]

    def mamba_ssm(chunk: int):
        from zebra_kernels.mamba2.mamba_ssm_backend import mamba_ssm_ssd

        def scan():
            kwargs = dict(initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=chunk)
            return mamba_ssm_ssd(x, dt, A, B, C, D, **kwargs)[0]

        return scan

    return [("fla", None, fla)] + [("mamba_ssm", c, mamba_ssm(c)) for c in chunk_sizes]


def _measure_row(backend, chunk, scan, leaves, d_y, reference, warmup: int, repeats: int) -> SsdBenchRow:
    """Time one scan (forward; forward + backward) and compare its output with `reference` (FLA's y)."""
    import torch

    from zebra_kernels.backend import mamba_ssm_import_error
    from zebra_kernels.testing import relative_error

    if backend == "mamba_ssm" and mamba_ssm_import_error():
        return SsdBenchRow(backend, chunk, None, None, None, error=mamba_ssm_import_error())
    try:
        y = scan()
        err = None if reference is None else relative_error(y, reference)
        forward = median_ms(scan, warmup, repeats)
        both = median_ms(lambda: torch.autograd.grad(scan(), leaves, d_y), warmup, repeats)
    except Exception as error:  # one backend failing (Triton version, shapes) must not hide the others
        return SsdBenchRow(backend, chunk, None, None, None, error=f"{type(error).__name__}: {error}"[:300])
    return SsdBenchRow(backend, chunk, forward, both, err)


def run_ssd_bench(
    recipe_name: str = "1b-mamba-mla",
    *,
    batch: int | None = None,
    seq_len: int | None = None,
    warmup: int = 3,
    repeats: int = 20,
    chunk_sizes: Sequence[int] = MAMBA_SSM_CHUNKS,
    on_progress: Callable[[float, float | None, str], None] | None = None,
) -> SsdBenchReport:
    """Time the Mamba2 scan per backend at `recipe_name`'s Mamba2 shapes (see the module docstring); mamba-ssm
    at each of `chunk_sizes` (each one autotunes its kernels anew)."""
    import torch

    from zebra_kernels import backend as kernel_backend
    from zebra_kernels.mamba2.mamba_ssm_backend import CHUNK_SIZE

    progress = on_progress or (lambda _done, _total, _note: None)
    recipe = load_recipe(recipe_name)
    config = arch.as_config(recipe.model.flat())
    layers = arch.resolve_pattern(config)[0::2].count(MAMBA2.char)
    if layers == 0:
        raise ZebraError(
            f"recipe {recipe.name} has no Mamba2 sublayer", fix="use a Mamba2 recipe, e.g. 1b-mamba-mla"
        )
    if not torch.cuda.is_available():
        raise ZebraError(
            "zebra bench ssd times GPU kernels: no CUDA/ROCm GPU here", fix="run it on a GPU machine"
        )
    m = recipe.model.mamba
    B, T = batch or recipe.train.micro_batch_size, seq_len or recipe.data.seq_len
    H = m.expand * recipe.model.hidden_size // m.head_dim
    device = torch.device("cuda", torch.cuda.current_device())
    leaves, d_y = ssd_bench_inputs(B, T, H, m.head_dim, m.num_groups, m.state_dim, device)
    rows, reference, scans = [], None, _scans(leaves, chunk_sizes)
    for i, (backend, chunk, scan) in enumerate(scans):
        progress(i, len(scans), f"{backend}" + (f" chunk {chunk}" if chunk else ""))
        row = _measure_row(backend, chunk, scan, leaves, d_y, reference, warmup, repeats)
        if backend == "fla" and row.error is None:
            with torch.no_grad():
                reference = scan()
            row.rel_err_vs_fla = 0.0
        rows.append(row)
    return SsdBenchReport(
        recipe=recipe.name,
        device=torch.cuda.get_device_name(device),
        batch=B,
        seq_len=T,
        heads=H,
        head_dim=m.head_dim,
        groups=m.num_groups,
        state_dim=m.state_dim,
        mamba_sublayers=layers,
        auto=kernel_backend.SSD_AUTO_CHUNK_BACKEND,
        auto_chunk=CHUNK_SIZE,
        rows=rows,
    )
