#!/usr/bin/env bash
# One GPU session in as few calls as possible: benchmarks first (timed alone), then the `gpu`-marked tests in
# parallel workers (Triton compilation is CPU-bound). Results land in $OUT:
#   summary.txt  bench.log  bench_train.json  decode_<recipe>.json  pytest_gpu.log  gpu_report.jsonl  profile.txt
#   decode_ab.jsonl  warm.jsonl
#   parity_{fp32,bf16}.json  parity_bf16.png  (phase parity: `zebra bench parity` on $PARITY_DATA, see
#   scripts/build-parity-data.sh)
# DECODE_RECIPES, TESTS and WORKERS override the decode recipes, the test paths and the xdist workers;
# BENCH_TRAINER=0 skips the 20-step trainer run after the bench.
# DEADLINE=S (seconds since start) caps the test phases so that the call ends in time.
# Usage, from the repo root on the GPU machine after shared/gpu/setup.sh put FLA + Triton in /tmp/site:
#   bash scripts/gpu-session.sh [bench] [decode] [profile] [parity] [tests] [tests-train]  (default: bench decode tests)
#   (more phases:)
#   decode-tests     the decode engine's GPU tests only (graphs across requests, sampling, no per-token sync, ...)
#   decode-ab        scripts/decode-ab.py on BASE (a snapshot of the commit before: git archive BASE_COMMIT src
#                    kernels recipes | tar -x -C .base, carried) and on this tree: kernels/step, step ms, generate ms
#   decode-compile   zebra bench decode with --compile (torch.compile inside the CUDA graph), no HF rows
#   warm             the same `zebra bench train` twice on an empty kernel cache: time to first step cold and warm
#   decode-checks    the decode checks of issue 15 item 17 and issue 18 items 1, 2, 5 in one phase, ending with a
#                    table (scripts/decode-checks.py, appended to summary.txt). Its files: pytest_decode.log,
#                    decode_ab.jsonl, decode_fla.json, warm_cold.json, warm_warm.json (+ summary.txt, bench.log,
#                    gpu_report.jsonl: 8). DECODE_CHECKS picks the parts, run in order (default "tests ab compile
#                    fla warm"); a part is skipped with a note when fewer seconds than it needs are left before
#                    DEADLINE (default 570 here). One 10-minute call fits about "tests ab", a second "compile fla
#                    warm" (the table shows what ran). ab runs .base too when it is there (see decode-ab).
set -uo pipefail
OUT=${OUT:-/tmp/zebra-gpu}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/kernels:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export ZEBRA_GPU_REPORT=$OUT/gpu_report.jsonl NCCL_NVLS_ENABLE=0 TRITON_CACHE_DIR=/tmp/triton-cache
zebra() { python3 -m zebra.cli.main "$@"; }
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
log=$OUT/bench.log
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
        timeout ${DECODE_TIMEOUT:-420} python3 -m zebra.cli.main bench decode "$r" --batch 1,8 --prompt 2048 --new 256 --json \
          > "$OUT/decode_$r.json" 2>> "$log"
        note "decode $r rc=$? $(tr -s ' \n' ' ' < "$OUT/decode_$r.json" | head -c 1500)"
      done;;
    decode-tests)
      left=$(( ${DEADLINE:-100000} - SECONDS )); [ "$left" -gt 570 ] && left=570
      timeout "$left" python3 -m pytest -m gpu -p no:cacheprovider -v -rA -n ${WORKERS:-4} --timeout 400 \
        tests/generation/test_gpu.py tests/models/test_gpu.py tests/kernels/test_kernel_gpu.py \
        -k "${DECODE_TESTS_K:-not linear_cross_entropy and not swiglu and not rms_norm}" 2>&1 \
        | tee "$OUT/pytest_gpu.log" | tail -30
      note "decode tests: $(grep -E 'passed|failed|error' "$OUT/pytest_gpu.log" | tail -1)";;
    decode-ab)
      for r in ${DECODE_RECIPES:-1b-gdn-pure 1b-mamba-mla}; do
        if [ -d "${BASE:-.base}/src" ]; then
          PYTHONPATH=/tmp/site:${BASE:-.base}/src:${BASE:-.base}/kernels timeout 200 python3 scripts/decode-ab.py "$r" \
            --label before >> "$OUT/decode_ab.jsonl" 2>> "$log"
          note "decode-ab $r before rc=$?"
        else
          note "decode-ab: no ${BASE:-.base}/src (make it with git archive, see the header); after only"
        fi
        timeout 200 python3 scripts/decode-ab.py "$r" --label after >> "$OUT/decode_ab.jsonl" 2>> "$log"
        note "decode-ab $r after rc=$?"
      done
      note "$(cat "$OUT/decode_ab.jsonl" 2>/dev/null)";;
    decode-compile)
      for r in ${DECODE_RECIPES:-1b-gdn-pure}; do
        timeout 300 python3 -m zebra.cli.main bench decode "$r" --batch 1,8 --prompt 2048 --new 256 --compile --no-hf \
          --json > "$OUT/decode_compile_$r.json" 2>> "$log"
        note "decode --compile $r rc=$? $(tr -s ' \n' ' ' < "$OUT/decode_compile_$r.json" | head -c 1200)"
      done;;
    warm)
      for r in ${WARM_RECIPES:-1b-kda-mla}; do
        cache=/tmp/zebra-kernels-$r; rm -rf "$cache"
        for run in cold warm; do
          env -u TRITON_CACHE_DIR ZEBRA_KERNEL_CACHE="$cache" timeout 420 python3 -m zebra.cli.main bench train "$r" \
            --steps 2 --warmup 1 --batch 8 --json > "$OUT/warm_$run.json" 2>> "$log"
          note "warm $r $run rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; \
print('first step', round(r['first_step_s'], 1), 's after build,', round(r['first_step_process_s'] or -1, 1), \
's after process start')" "$OUT/warm_$run.json" 2>&1)"
        done
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
    decode-checks)
      deadline=${DEADLINE:-570}
      fits() { local left=$(( deadline - SECONDS )); [ "$left" -ge "$1" ] && return 0; note "decode-checks $2: not run ($left s left)"; return 1; }
      for part in ${DECODE_CHECKS:-tests ab compile fla warm}; do
        case $part in
          tests) fits 120 tests && { timeout $(( deadline - SECONDS )) python3 -m pytest -m gpu -p no:cacheprovider -v -rA \
              -n ${WORKERS:-4} --timeout 400 tests/generation/test_gpu.py > "$OUT/pytest_decode.log" 2>&1
            note "decode-checks tests: $(grep -E 'passed|failed|error' "$OUT/pytest_decode.log" | tail -1)"; };;
          ab) for r in 1b-gdn-pure 1b-mamba-mla; do
              [ -d "${BASE:-.base}/src" ] && fits 90 "ab $r before" && PYTHONPATH=/tmp/site:${BASE:-.base}/src:${BASE:-.base}/kernels \
                timeout 200 python3 scripts/decode-ab.py "$r" --label before >> "$OUT/decode_ab.jsonl" 2>> "$log"
              fits 90 "ab $r" && { timeout 200 python3 scripts/decode-ab.py "$r" --label after >> "$OUT/decode_ab.jsonl" 2>> "$log"
                note "decode-checks ab $r rc=$?"; }
            done;;
          compile) for r in 1b-gdn-pure 1b-mamba-mla; do
              fits 120 "compile $r" && { timeout 240 python3 scripts/decode-ab.py "$r" --label compile --compile \
                >> "$OUT/decode_ab.jsonl" 2>> "$log"; note "decode-checks compile $r rc=$?"; }
            done;;
          fla) fits 150 fla && { timeout 300 python3 -m zebra.cli.main bench decode 1b-gdn-pure --batch 1 --prompt 2048 \
              --new 256 --json > "$OUT/decode_fla.json" 2>> "$log"; note "decode-checks fla rc=$?"; };;
          warm) r=${WARM_RECIPES:-1b-kda-mla}; cache=/tmp/zebra-kernels-$r; rm -rf "$cache"
            for run in cold warm; do
              fits 60 "warm $run" && { env -u TRITON_CACHE_DIR -u TORCHINDUCTOR_CACHE_DIR ZEBRA_KERNEL_CACHE="$cache" \
                timeout $(( deadline - SECONDS )) python3 -m zebra.cli.main bench train "$r" --steps 2 --warmup 1 --batch 8 \
                --json > "$OUT/warm_$run.json" 2>> "$log"; note "decode-checks warm $run rc=$?"; }
            done;;
          *) note "decode-checks: unknown part $part";;
        esac
      done
      python3 scripts/decode-checks.py "$OUT" | tee -a "$OUT/summary.txt";;
    parity)  # the data from scripts/build-parity-data.sh, carried to $PARITY_DATA (e.g. carry data/parity-python-docs)
      data=${PARITY_DATA:-data/parity-python-docs}/chunks
      for precision in fp32 bf16; do
        steps=250 limit=400; [ $precision = fp32 ] && steps=5 limit=150  # both within one 600 s call
        timeout $limit python3 -m zebra.cli.main bench parity 1b-gdn-pure --data "$data" --steps $steps --batch 4 \
          --set model.vocab_size=16384 --set train.precision=$precision --output /tmp/parity-$precision --json \
          > "$OUT/parity_$precision.json" 2>> "$log"
        note "parity $precision rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r[k] for k in ('step1_diff', 'max_rel_diff', 'final_rel_diff')}, r['zebra_loss'][-1], r['fla_loss'][-1])" "$OUT/parity_$precision.json" 2>&1 | tail -1)"
      done
      cp /tmp/parity-bf16/parity.png "$OUT/parity_bf16.png" 2>/dev/null;;
    *) note "unknown phase $phase";;
  esac
  note "phase $phase: $((SECONDS - t0)) s"
done
cat "$OUT/summary.txt"
