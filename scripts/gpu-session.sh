#!/usr/bin/env bash
# One GPU session in as few calls as possible: benchmarks first (timed alone), then the `gpu`-marked tests in
# parallel workers (Triton compilation is CPU-bound). Results land in $OUT (at most 8 files):
#   summary.txt  bench.log  bench_train.json  decode_<recipe>.json  pytest_gpu.log  gpu_report.jsonl  profile.txt
#   perf.jsonl (the phases ssd, levers, hybrids: one JSON line per measurement, tabled at the end)
# DECODE_RECIPES, TESTS and WORKERS override the decode recipes, the test paths and the xdist workers;
# BENCH_TRAINER=0 skips the 20-step trainer run after the bench; LEVERS overrides the variants of `levers`
# (names in scripts/gpu-perf.py: base-b8 base-b16 vs-llama fuse optgraph ac-b16 mamba-ssm compile-mlp compile-all fp8).
# DEADLINE=S (seconds since start) caps the test and perf phases so that the call ends in time.
# Usage, from the repo root on the GPU machine after shared/gpu/setup.sh put FLA + Triton (and mamba-ssm) in
# /tmp/site; wheels in .gpuwheels-extra/ (git-ignored; carry it) are installed there too. It holds torchao for
# train.fp8, fetched on the CPU machine with: python3 -m pip download --no-deps --only-binary=:all: \
#   --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#   --platform manylinux2014_x86_64 -d .gpuwheels-extra torchao==0.17.0
# and mamba-ssm 2.2.6.post3 (what `[mamba]` installs; it replaces the 2.3 of .gpuwheels/base), built without nvcc:
#   pip install wheel && MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip wheel --no-deps --no-build-isolation \
#   mamba-ssm==2.2.6.post3 -w .gpuwheels-extra
#   bash scripts/gpu-session.sh [bench] [decode] [profile] [tests] [tests-train] [perf18] [ssd] [levers] [hybrids] [tests-perf]
#   (default: bench decode tests). Issue 18 items 3-4, the short form (one call, about 6 minutes, one table):
#   DEADLINE=360 bash scripts/gpu-session.sh perf18
# and the full set in two calls of under 10 minutes each (compile, fp8, activation checkpointing, 1b-kda-mla):
#   DEADLINE=560 bash scripts/gpu-session.sh ssd levers        # Mamba2 scan backends; 1b-gdn-pure vs FLA + levers
#   DEADLINE=560 bash scripts/gpu-session.sh hybrids tests-perf    # hybrids vs Llama; the new GPU tests
set -uo pipefail
OUT=${OUT:-/tmp/zebra-gpu}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/kernels:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export ZEBRA_GPU_REPORT=$OUT/gpu_report.jsonl NCCL_NVLS_ENABLE=0 TRITON_CACHE_DIR=/tmp/triton-cache
zebra() { python3 -m zebra.cli.main "$@"; }
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
log=$OUT/bench.log
if compgen -G ".gpuwheels-extra/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpuwheels-extra/*.whl >> "$log" 2>&1 || note "warning: .gpuwheels-extra did not install (see bench.log)"
fi
# perf PHASE_SECONDS ARGS...: scripts/gpu-perf.py with the time left (DEADLINE) as its deadline, output to perf.jsonl
perf() {
  local secs=$1 left; shift
  left=$(( ${DEADLINE:-100000} - SECONDS )); [ "$left" -lt "$secs" ] && secs=$left
  [ "$secs" -lt 60 ] && { note "perf $*: skipped (DEADLINE)"; return; }
  DEADLINE_AT=$(( $(date +%s) + secs - 15 )) timeout "$secs" python3 scripts/gpu-perf.py "$@" --out "$OUT/perf.jsonl" \
    2>> "$log" | tee -a "$log"
  note "perf $* rc=${PIPESTATUS[0]}"
}
phases=("$@"); [ ${#phases[@]} -eq 0 ] && phases=(bench decode tests)
note "== $(date -u +%FT%TZ) $(python3 -c 'import torch,triton;print("torch",torch.__version__,"triton",triton.__version__,torch.cuda.get_device_name(0))')"
for phase in "${phases[@]}"; do
  t0=$SECONDS
  case $phase in
    bench)
      timeout 300 python3 -m zebra.cli.main bench train 1b-gdn-pure --steps 10 --warmup 3 --batch 8 --against fla --json \
        > "$OUT/bench_train.json" 2>> "$log"
      note "bench train rc=$? $(tr -s ' \n' ' ' < "$OUT/bench_train.json" | head -c 1500)"
      if [ "${BENCH_TRAINER:-1}" != 0 ]; then
        timeout 240 python3 -m zebra.cli.main train 1b-gdn-pure --mock-data --max-steps 20 --output /tmp/runs --run gpu20 \
          --yes --resume never --set train.micro_batch_size=8 --set train.global_batch_size=8 --set train.save_interval=0 \
          --set train.eval_interval=0 --set train.export=false --set train.log_interval=5 >> "$log" 2>&1
        note "train 20 steps rc=$? $(tail -2 /tmp/runs/gpu20/metrics.jsonl 2>/dev/null | tr -s '\n' ' ')"
      fi;;
    decode)
      for r in ${DECODE_RECIPES:-1b-gdn-pure 1b-mamba-mla}; do
        timeout 240 python3 -m zebra.cli.main bench decode "$r" --batch 1,8 --prompt 2048 --new 256 --json \
          > "$OUT/decode_$r.json" 2>> "$log"
        note "decode $r rc=$? $(tr -s ' \n' ' ' < "$OUT/decode_$r.json" | head -c 1500)"
      done;;
    profile)
      timeout 300 python3 scripts/profile-train.py 1b-gdn-pure --batch 8 --against fla > "$OUT/profile.txt" 2>> "$log"
      note "profile rc=$? (profile.txt)";;
    tests)
      left=$(( ${DEADLINE:-100000} - SECONDS )); [ "$left" -gt 570 ] && left=570
      timeout "$left" python3 -m pytest -m gpu -p no:cacheprovider -v -rA -n ${WORKERS:-6} --timeout 400 \
        ${TESTS:-tests/kernels tests/models tests/convert tests/generation tests/doctor} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
      note "tests: $(grep -E 'passed|failed|error' "$OUT/pytest_gpu.log" | tail -1)";;
    tests-train)
      timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -m gpu -p no:cacheprovider -s --timeout 400 tests/train \
        2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -30
      note "tests train: $(grep -E 'passed|failed|error' "$OUT/pytest_gpu.log" | tail -1)";;
    perf18)  # issue 18 items 3-4 in one call of about 6 minutes (DEADLINE=360), most wanted first: 1b-gdn-pure vs
      # FLA at batch 8 and 16 (the goals) and two levers, 1b-mamba-mla vs Llama and on mamba-ssm's scan, the scan alone
      perf 150 train 1b-gdn-pure base-b8 base-b16 fuse optgraph
      perf 130 train 1b-mamba-mla vs-llama mamba-ssm
      perf 70 ssd 1b-mamba-mla 256;;
    ssd)  # Mamba2 scan: FLA's simple-GLA path vs mamba-ssm's chunked kernel, fwd and fwd+bwd at 1b-mamba-mla shapes
      perf 240 ssd 1b-mamba-mla;;
    levers)  # 1b-gdn-pure vs FLA at batch 8 and 16 (the goals), then each lever alone (zebra row only)
      perf 540 train 1b-gdn-pure ${LEVERS:-base-b8 base-b16 fuse optgraph ac-b16 compile-mlp fp8};;
    hybrids)  # 1b-mamba-mla (also on mamba-ssm's scan) and 1b-kda-mla vs Llama-3.2-1B's shape (HF SDPA)
      perf 240 train 1b-mamba-mla vs-llama mamba-ssm
      perf 400 train 1b-kda-mla vs-llama;;
    tests-perf)  # the GPU tests of issue 18 items 3-4: mamba-ssm vs float64, its model path, the levers
      left=$(( ${DEADLINE:-100000} - SECONDS )); [ "$left" -gt 400 ] && left=400
      timeout "$left" python3 -m pytest -m gpu -p no:cacheprovider -v -rA -n ${WORKERS:-4} --timeout 300 \
        tests/kernels/test_kernel_gpu.py::test_mamba2_mamba_ssm_matches_reference tests/kernels/test_bench_ssd.py \
        tests/models/test_gpu.py::test_tiny_mamba_on_mamba_ssm_matches_torch_backend_with_gradients \
        tests/train/test_levers.py 2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -30
      note "tests-perf: $(grep -E 'passed|failed|error' "$OUT/pytest_gpu.log" | tail -1)";;
    *) note "unknown phase $phase";;
  esac
  note "phase $phase: $((SECONDS - t0)) s"
done
[ -s "$OUT/perf.jsonl" ] && python3 scripts/gpu-perf.py table "$OUT/perf.jsonl" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
