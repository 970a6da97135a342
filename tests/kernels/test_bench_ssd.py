"""`zebra bench ssd`: the advice that tells the lead what `auto` should run, and (GPU) a short
real run of every row."""

from __future__ import annotations

import pytest
import torch

from zebra.bench.ssd import SsdBenchReport, SsdBenchRow


def report(rows, auto="fla", auto_chunk=256) -> SsdBenchReport:
    return SsdBenchReport("1b-mamba-mla", "gpu", 8, 2048, 32, 64, 8, 64, 12, auto, auto_chunk, rows)


def test_advice_names_the_setting_that_makes_auto_take_the_fastest_row():
    rows = [
        SsdBenchRow("fla", None, 1.0, 3.0, 0.0),
        SsdBenchRow("mamba_ssm", 128, 0.9, 2.5, 3e-3),
        SsdBenchRow("mamba_ssm", 256, 0.8, 2.8, 3e-3),
        SsdBenchRow("mamba_ssm", 64, None, None, None, error="RuntimeError: out of resources"),
    ]
    r = report(rows)
    assert r.fastest is rows[1]
    assert r.advice == (
        "SSD_AUTO_CHUNK_BACKEND = 'mamba_ssm' in kernels/zebra_kernels/backend.py "
        "and CHUNK_SIZE = 128 in kernels/zebra_kernels/mamba2/mamba_ssm_backend.py"
    )
    assert r.to_dict()["fastest"]["chunk_size"] == 128
    # auto already on mamba-ssm: only the chunk size is left to change (or nothing, at the faster chunk)
    assert (
        report(rows, auto="mamba_ssm").advice
        == "CHUNK_SIZE = 128 in kernels/zebra_kernels/mamba2/mamba_ssm_backend.py"
    )
    assert report(rows, auto="mamba_ssm", auto_chunk=128).advice == ""


def test_advice_is_empty_when_auto_already_runs_the_fastest_or_nothing_ran():
    assert (
        report([SsdBenchRow("fla", None, 1.0, 2.0, 0.0), SsdBenchRow("mamba_ssm", 256, 1.0, 2.5, 0.0)]).advice
        == ""
    )
    failed = report([SsdBenchRow("fla", None, None, None, None, error="x")])
    assert failed.fastest is None and failed.advice == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_bench_ssd_times_every_row_on_a_gpu():
    from zebra.bench.ssd import run_ssd_bench
    from zebra_kernels.backend import mamba_ssm_import_error

    r = run_ssd_bench("1b-mamba-mla", batch=1, seq_len=512, warmup=1, repeats=2)
    assert (r.heads, r.head_dim, r.groups, r.state_dim, r.mamba_sublayers) == (32, 64, 8, 64, 12)
    for row in r.rows:
        if row.backend == "mamba_ssm" and mamba_ssm_import_error():
            continue
        assert row.error is None, row.error
        assert 0 < row.forward_ms < row.forward_backward_ms and row.rel_err_vs_fla < 2e-2
