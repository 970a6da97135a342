#!/usr/bin/env bash
# One GPU session in as few calls as possible. Run from the repo root on the GPU machine after
# shared/gpu/setup.sh put FLA + Triton in /tmp/site; wheels in .gpuwheels-extra/ (git-ignored; carry it) are
# installed there too (torchao for train.fp8; mamba-ssm 2.2.6.post3, what `[mamba]` installs, built without nvcc:
#   pip install wheel && MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip wheel --no-deps --no-build-isolation \
#   mamba-ssm==2.2.6.post3 -w .gpuwheels-extra; py-spy for warm-spy: pip download --no-deps --only-binary=:all: py-spy).
#
#   bash scripts/gpu-session.sh PHASE...          (default: bench trainer decode tests)
#
# Phases (each appends a line to $OUT/summary.txt; at most 8 files come back from $OUT):
#   bench          zebra bench train 1b-gdn-pure vs FLA                               bench_train.json
#   trainer        a 20-step `zebra train 1b-gdn-pure --mock-data` run (tokens/s, time to the first step)
#   fp8-curve      1b-gdn-pure FP8 vs bf16 over 1,000 steps of python3.11-doc text (FP8_DATA, FP8_BATCH,
#                  FP8_STEPS, FP8_COMPILE, FP8_SUBLAYERS; scripts/fp8-curve.py)      fp8_curve.json/png
#                  (2026-12-04, batch 2: bf16 about 300 s with a cold Triton cache, FP8 12k tok/s: over 340 s)
#   decode         zebra bench decode on DECODE_RECIPES                               decode_<recipe>.json
#   profile        scripts/profile-train.py: top kernels and GPU idle gaps, zebra and FLA   profile.txt, trace_*.json.gz
#   profile-ssd    the same for 1b-mamba-mla on FLA's and on mamba-ssm's Mamba2 scan   profile_ssd_{fla,mamba_ssm}.txt
#   warm-spy       a warm `zebra bench train` (WARM_RECIPES) under py-spy, plain, and without zebra's bytecode cache   warm_spy.txt
#   tests          the `gpu`-marked tests (TESTS, TESTS_K a -k expression, WORKERS xdist workers)   pytest_gpu.log
#                  (68 tests; 6 workers ran 36 of them in 524 s on 2026-12-03: split them over two calls,
#                  TESTS="tests/generation tests/convert tests/doctor tests/train", then "tests/kernels tests/models")
#   tests-train    the `gpu`-marked training tests, one process
#   decode-tests / decode-ab / decode-compile / warm   the parts of decode-checks, one at a time
#   decode-checks  issue 15 item 17, issue 18 items 1, 2, 5, ending with a goal table (scripts/decode-checks.py);
#                  DECODE_CHECKS picks the parts (default "tests ab compile fla warm"); one 10-minute call fits
#                  about "tests ab", a second "compile fla warm". ab compares with .base when carried:
#                  git archive BASE_COMMIT src kernels recipes | (mkdir -p .base && tar -x -C .base)
#   figures        scripts/upcycle-figure.py then pipeline-figure.py (FIG_SCRIPTS, FIG_ARGS, FIG_DATA, FIG_TEACHER)
#                  upcycle-figure.json/png, pipeline-pipeline.json/png, figures.txt. The GPU machine lacks gguf:
#                  pip download --no-deps gguf -d .gpuwheels-extra. The teacher (98 MB) and the data (9 MB) travel
#                  as a tar split beside the Triton parts (64 MiB a call with the tree); keep the teacher under /tmp
#                  there (an untracked file in the tree is removed by the next call). One upcycle-figure student takes about 6 min;
#                  pipeline-figure --pipelines kd 409 s, --pipelines ild,smart 571 s (cold Triton cache).
#   mla-decode     issue 41 items 1-2: MLA decode kernel GPU tests, real-length figure (1b-mamba-mla, 1b-kda-mla),
#                  step profiles of 1b-mamba-mla and 1b-gdn-pure (MLA_DRY=1: tiny recipes on the CPU)   decode_mla_*.json
#                  bash shared/gpu/setup.sh && DEADLINE=480 bash scripts/gpu-session.sh mla-decode   (one H100 call,
#                  at most 9 minutes: tests 160 s, then the recipes in order while DEADLINE leaves 60 s)
#   fused-decode   issue 41 item 1: `zebra bench decode --fused-decode` (Zebra's GEMV kernels) against the same bench
#                  without it, FUSED_RECIPES (1b-mamba-mla 1b-gdn-pure) at batch 1 and 8 with step profiles, after
#                  the kernels' GPU tests (FUSED_TESTS=0 skips; FUSED_DRY=1: tiny recipes on the CPU) and
#                  scripts/gemv-bench.py (each projection shape alone, against cuBLAS: into summary.txt)   decode_mla_*.json
#   longctx        issue 41 item 3: batch-1 training at LONG_LENGTHS (8192 16384 32768) of 1b-gdn-pure vs FLA's class,
#                  LONG_HYBRIDS (1b-mamba-mla 1b-kda-mla) vs Llama-3.2-1B's shape at LONG_HYBRID_LEN (32768), then
#                  decode of LONG_DECODE_RECIPES at LONG_PROMPT (32768) cached tokens against Llama-3.2-1B's shape with
#                  a static KV cache; every report in long.jsonl
#   parity         zebra bench parity (fp32 5 steps, bf16 250) on PARITY_DATA (scripts/build-parity-data.sh)
#   perf18         issue 18 items 3-4 in one call of about 8 minutes (DEADLINE=480), one table  perf.jsonl
#   ssd levers     Mamba2 scan backends; our pre-norm and SwiGLU kernels against FLA's, then 1b-gdn-pure vs FLA with each lever
#                  (LEVERS: names in scripts/gpu-perf.py)
#   hybrids tests-perf   hybrids vs Llama-3.2-1B's shape (and 1b-mamba-mla on FLA's scan, with fused projections;
#                  HYBRIDS_MAMBA and HYBRIDS_KDA pick other gpu-perf variants); the GPU tests of issue 18 items 3-4
#   distill        issue 40: scripts/distill-figure.py runs side by side, one process each (DISTILL_RUNS, default
#                  "p50m s50m c10m": the 50M Mamba2 pipeline without ILD at KD LR 3e-4, its 50M scratch twin, the
#                  same at 10M; s10m: the twin at 10M; a10m: 10M at KD LR 1e-3; g10m: the GDN pipeline and its twin
#                  at 10M, one after the other; c10m and a10m take p50m's calibrated students, --upcycled-from, once
#                  it has them, when p50m runs too), --micro-batch DISTILL_MICRO (8; a run keeps its own), the pack
#                  of scripts/pack-corpus.py unpacked in DISTILL_DIR (/tmp/zfig); resumed by the next call with the
#                  same DISTILL_RUNS; p50m drawn with s50m and c10m ("mamba2 (10M)"), those complete, in one
#                  figure, and c10m with s10m; the twins' shape: the hybrid upcycled uncalibrated with MLA at
#                  DISTILL_MLA_LAYERS (0,4,...,28: step 0's); DISTILL_ARGS are appended (a CPU dry run: small
#                  --tokens, --seq-len, ...)                                               distill.tgz
#   calibrate      issue 40: zebra distill's two students calibrated (CAL_ARGS: 128 x 512 tokens, 600 steps),
#                  timed, composed even and smart with 8 MLA, their held-out CE and the teacher's; then the
#                  recurrent calibration at CAL_ANCHOR_STEPS with 1 process and with 8 (the same run's ratio;
#                  CAL_ANCHORS="" skips it); CAL_MIXER (mamba) is the recurrent mixer, CAL_MLA an all-MLA student
#                  calibrated before (e.g. /tmp/zfig/p50m/distill-mamba2/upcycle-mla) to use instead of calibrating one,
#                  CAL_MLA_ARGS more flags for calibrating it (the activation-aware SVD: "--svd activation --calibration DIR");
#                  the pack in CAL_DIR (/tmp/zs), CAL_DEVICE (cuda)          cal-*.json, cal-ce.jsonl, upcycle-smart.json
#   kd-speed       issue 40: KD's tokens/s and MFU for the Mamba2 + 8 MLA student of the teacher in CAL_DIR (uncalibrated:
#                  speed only), KD_STEPS (12) steps of 2048-token sequences for each of KD_VARIANTS, "MICRO[:KEY=V,...]"
#                  (default "8 16 32 16:train.compile=true"; the step is max(16, MICRO) sequences, as zebra distill's
#                  figure at 16); each row the median over the steps after the first three        kd-speed.jsonl
#   save-kernels   the warm Triton + inductor caches as kernels.tgz.NN parts of 12 MB (at most 5) in $OUT, so that
#                  the next session skips the minutes of compiling and autotuning on its fresh machine: keep the
#                  parts under .gpucache/ here (git-ignored), carry one beside each Triton part, copy each to
#                  /tmp/gcache there; this script restores them (KERNEL_PARTS) before its first phase.
# DEADLINE=S (seconds since start) caps the test and perf phases so that the call ends in time.
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
parts=${KERNEL_PARTS:-/tmp/gcache}
if compgen -G "$parts/kernels.tgz.*" > /dev/null && [ ! -d /tmp/triton-cache ]; then
  cat "$parts"/kernels.tgz.* | tar -xzP -f - && echo "kernel cache restored from $parts ($(du -sh /tmp/triton-cache | cut -f1))" \
    | tee -a "$OUT/summary.txt" || echo "warning: the kernel cache in $parts did not unpack" | tee -a "$OUT/summary.txt"
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
phases=("$@"); [ ${#phases[@]} -eq 0 ] && phases=(bench trainer decode tests)
note "== $(date -u +%FT%TZ) $(python3 -c 'import torch,triton;print("torch",torch.__version__,"triton",triton.__version__,torch.cuda.get_device_name(0))')"
for phase in "${phases[@]}"; do
  t0=$SECONDS
  case $phase in
    bench)
      timeout 300 python3 -m zebra.cli.main bench train 1b-gdn-pure --steps 10 --warmup 3 --batch 8 --against fla --json \
        > "$OUT/bench_train.json" 2>> "$log"
      note "bench train rc=$? $(tr -s ' \n' ' ' < "$OUT/bench_train.json" | head -c 1500)";;
    trainer)
      timeout 240 python3 -m zebra.cli.main train 1b-gdn-pure --mock-data --max-steps 20 --output /tmp/runs --run gpu20 \
        --yes --resume never --set train.micro_batch_size=8 --set train.global_batch_size=8 --set train.save_interval=0 \
        --set train.eval_interval=0 --set train.export=false --set train.log_interval=5 >> "$log" 2>&1
      note "train 20 steps rc=$? $(grep time_to_first /tmp/runs/gpu20/metrics.jsonl; tail -2 /tmp/runs/gpu20/metrics.jsonl 2>/dev/null | tr -s '\n' ' ')";;
    fp8-curve)  # FP8 against bf16, FP8_STEPS (1000) steps of FP8_BATCH x 2048 tokens of real text each, same seed and
      # data order: FP8_DATA is scripts/build-parity-data.sh's output (chunks/ and tokenizer/, vocab 16384)
      data=${FP8_DATA:-data/parity-python-docs} batch=${FP8_BATCH:-2}
      # FP8_PARALLEL=1: both runs at once (a batch-2 step leaves the GPU mostly idle; each run's losses are its own)
      for run in ${FP8_RUNS:-bf16 fp8}; do  # FP8_RUNS=bf16 then FP8_RUNS=fp8: two calls on one warm machine
        levers=(); [ $run = fp8 ] && levers=(--set train.fp8=true --set train.compile=true \
          --set train.compile_sublayers=${FP8_COMPILE:--} --set train.fp8_sublayers=${FP8_SUBLAYERS:--} \
          --set train.fp8_recipe=${FP8_RECIPE:-tensorwise})
        # FP8_COMPILE=all: every sublayer compiled; FP8_SUBLAYERS=all: float8 on every sublayer (gpu-perf's fp8-all)
        left=$(( ${DEADLINE:-100000} - SECONDS )); [ "$left" -lt 60 ] && { note "fp8-curve $run: not run ($left s left)"; continue; }
        { timeout "$left" python3 -m zebra.cli.main train 1b-gdn-pure --data "$data/chunks" --run $run --output /tmp/fp8runs \
          --max-steps ${FP8_STEPS:-1000} --yes --resume never --set data.tokenizer="$data/tokenizer" \
          --set model.vocab_size=16384 --set train.micro_batch_size=$batch --set train.global_batch_size=$batch \
          --set train.save_interval=0 --set train.eval_interval=0 --set train.export=false --set train.log_interval=1 \
          "${levers[@]}" >> "$log.$run" 2>&1; echo $? > "$log.$run.rc"; } &
        [ "${FP8_PARALLEL:-0}" = 1 ] || wait $!
      done
      wait
      for run in ${FP8_RUNS:-bf16 fp8}; do
        cat "$log.$run" >> "$log" 2>/dev/null  # absent for a run left out (DEADLINE)
        note "fp8-curve $run rc=$(cat "$log.$run.rc" 2>/dev/null) $(tail -1 /tmp/fp8runs/$run/metrics.jsonl 2>/dev/null)"
        rm -rf /tmp/fp8runs/$run/checkpoints  # tens of GB each; the curve is what counts
      done
      [ -f /tmp/fp8runs/bf16/metrics.jsonl ] && [ -f /tmp/fp8runs/fp8/metrics.jsonl ] && python3 scripts/fp8-curve.py /tmp/fp8runs/bf16 /tmp/fp8runs/fp8 --out "$OUT/fp8_curve.json" --png "$OUT/fp8_curve.png" \
        2>&1 | tee -a "$OUT/summary.txt";;
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
    warm)  # WARM_RECIPES each run cold, then warm (the goal: < 20 s to the first step), on one kernel cache that
      # starts empty (a later recipe's cold run may find kernels an earlier one tuned); the recipe's micro batch
      # unless WARM_BATCH; DEADLINE skips a run that would not fit (WARM_NEED seconds, cold: WARM_COLD_NEED)
      cache=/tmp/zebra-kernels-warm; rm -rf "$cache"
      for r in ${WARM_RECIPES:-1b-kda-mla}; do
        for run in cold warm; do
          need=${WARM_NEED:-60}; [ $run = cold ] && need=${WARM_COLD_NEED:-240}
          left=$(( ${DEADLINE:-100000} - SECONDS )); [ "$left" -gt 420 ] && left=420
          [ "$left" -lt "$need" ] && { note "warm $r $run: not run ($left s left)"; continue; }
          env -u TRITON_CACHE_DIR -u TORCHINDUCTOR_CACHE_DIR ZEBRA_KERNEL_CACHE="$cache" timeout "$left" \
            python3 -m zebra.cli.main bench train "$r" --steps 2 --warmup 1 ${WARM_BATCH:+--batch $WARM_BATCH} --json \
            > "$OUT/warm_${r}_$run.json" 2>> "$log"
          note "warm $r $run rc=$? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['rows'][0]; \
print(d['batch'], 'x', d['seq_len'], 'first step', round(r['first_step_s'], 1), 's after build,', \
round(r['first_step_process_s'] or -1, 1), 's after process start')" "$OUT/warm_${r}_$run.json" 2>&1 | tail -1)"
        done
      done;;
    warm-spy)  # a warm start's seconds: WARM_RECIPES' `zebra bench train` on the kernel cache an earlier phase (or
      # save-kernels' parts) filled: once (which fills zebra's bytecode cache where PYTHONDONTWRITEBYTECODE is set),
      # under py-spy (in .gpuwheels-extra: where the seconds go; its own lines land around the JSON), plain (the
      # figure), with ZEBRA_PYCACHE=0
      python3 -c "import importlib.util, os, sys
print('dont_write_bytecode', sys.flags.dont_write_bytecode, 'pycache_prefix', sys.pycache_prefix)
for name in ('torch', 'transformers', 'triton', 'fla', 'zebra'):
    d = os.path.dirname(importlib.util.find_spec(name).origin)
    print(name, d, '__pycache__:', os.path.isdir(os.path.join(d, '__pycache__')), 'writable:', os.access(d, os.W_OK))" \
        > "$OUT/warm_spy.txt" 2>&1
      first() { python3 -c "import json,sys; t=open(sys.argv[1]).read(); r=json.loads(t[t.index('{'):t.rindex('}') + 1])['rows'][0]; \
print({k: round(r[k], 2) for k in ('first_step_process_s', 'first_step_s', 'build_s', 'step_setup_s')})" "$1" 2>&1 | tail -1; }
      for r in ${WARM_RECIPES:-1b-gdn-pure}; do
        bench=(-m zebra.cli.main bench train "$r" --steps 2 --warmup 1 --batch 8 --json)
        timeout 200 python3 "${bench[@]}" > /tmp/warm-run.json 2>> "$log"; note "warm-spy $r first rc=$? $(first /tmp/warm-run.json)"
        timeout 200 /tmp/site/bin/py-spy record --idle --nonblocking -r 100 --format raw -o /tmp/warm-$r.txt -- \
          python3 "${bench[@]}" > /tmp/warm-spy.json 2>> "$log"
        note "warm-spy $r under py-spy rc=$? $(first /tmp/warm-spy.json)"
        python3 scripts/stack-summary.py /tmp/warm-$r.txt --top 70 >> "$OUT/warm_spy.txt" 2>&1
        for run in plain ZEBRA_PYCACHE=0; do
          env $([ $run = plain ] || echo $run) timeout 200 python3 "${bench[@]}" > /tmp/warm-run.json 2>> "$log"
          note "warm-spy $r $run rc=$? $(first /tmp/warm-run.json)"
        done
      done;;
    profile)
      timeout 300 python3 scripts/profile-train.py 1b-gdn-pure --batch 8 --against fla --trace "$OUT" > "$OUT/profile.txt" 2>> "$log"
      note "profile rc=$? (profile.txt)";;
    profile-ssd)  # why 1b-mamba-mla's step is faster on mamba-ssm's scan while the scan alone is faster on FLA's
      for b in fla mamba_ssm; do
        timeout 240 python3 scripts/profile-train.py 1b-mamba-mla --batch 8 --top 40 --set model.kernel_backend=$b \
          > "$OUT/profile_ssd_$b.txt" 2>> "$log"
        note "profile-ssd $b rc=$? (profile_ssd_$b.txt)"
      done;;
    tests)
      left=$(( ${DEADLINE:-100000} - SECONDS )); [ "$left" -gt ${TESTS_LIMIT:-570} ] && left=${TESTS_LIMIT:-570}
      timeout "$left" python3 -m pytest -m gpu -p no:cacheprovider -v -rA -n ${WORKERS:-6} --timeout 400 \
        ${TESTS:-tests/kernels tests/models tests/convert tests/generation tests/doctor} -k "${TESTS_K:-}" 2>&1 \
        | tee "$OUT/pytest_gpu.log" | tail -30
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
              -n ${WORKERS:-4} --timeout 400 tests/generation/test_gpu.py \
              tests/kernels/test_kernel_gpu.py::test_mamba2_decode_step_kernel_matches_reference \
              tests/kernels/test_kernel_gpu.py::test_conv_decode_step_kernel_matches_reference > "$OUT/pytest_decode.log" 2>&1
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
            for run in cold warm; do  # WARM_COLD_ARGS: the cold run can be a comparison too (--against llama)
              args="--steps 2 --warmup 1"; need=60; [ $run = cold ] && args=${WARM_COLD_ARGS:-$args} need=${WARM_COLD_S:-60}
              fits "$need" "warm $run" && { env -u TRITON_CACHE_DIR -u TORCHINDUCTOR_CACHE_DIR ZEBRA_KERNEL_CACHE="$cache" \
                timeout $(( deadline - SECONDS )) python3 -m zebra.cli.main bench train "$r" $args --batch 8 \
                --json > "$OUT/warm_$run.json" 2>> "$log"; note "decode-checks warm $run rc=$?"; }
            done;;
          *) note "decode-checks: unknown part $part";;
        esac
      done
      python3 scripts/decode-checks.py "$OUT" | tee -a "$OUT/summary.txt";;
    mla-decode)  # issue 41 items 1-2 in one call of about 8 minutes (DEADLINE=480): the MLA decode kernel's GPU
      # tests, the fused token-choice and RoPE kernels' (with the engine's graph tests), 1b-mamba-mla's real-length
      # figure (MLA_LENGTHS cached tokens, a capacity of the longest + 256 against a cache sized to each) with its
      # step profile, 1b-gdn-pure's step profile, then 1b-kda-mla's lengths if
      # time is left; every report decode_mla_<recipe>.json, summed up by scripts/mla-decode-summary.py.
      # MLA_DRY=1: the same commands on tiny recipes on the CPU (no tests), to check the phase without a GPU;
      # MLA_TESTS=0 skips the tests (160 s) when the call is short.
      dry=${MLA_DRY:-0} lens=${MLA_LENGTHS:-1024,8192,32768} size=(--prompt 2048 --new 256)
      runs=("1b-mamba-mla:--profile --lengths $lens" "1b-gdn-pure:--profile" "1b-kda-mla:--lengths $lens")
      [ "$dry" = 1 ] && { size=(--prompt 16 --new 4 --device cpu --dtype fp32); lens=8,24
        runs=("tiny:--profile --lengths $lens" "tiny-gdn:--profile" "tiny-kda:--lengths $lens"); }
      if [ "$dry" != 1 ] && [ "${MLA_TESTS:-1}" = 1 ]; then  # MLA_TESTS=0: the figures only
        timeout 160 python3 -m pytest -m gpu -p no:cacheprovider -v -rA -n ${WORKERS:-6} --timeout 150 \
          tests/kernels/test_mla_decode_gpu.py tests/kernels/test_choice.py tests/kernels/test_rope.py \
          tests/generation/test_gpu.py tests/models/test_gpu.py -k "${MLA_TESTS_K:-mla_decode or fused_kernel or \
kernel_on_a_gpu or cuda_graph_decode_equals_eager or growing_and_shrinking or seeded_sampling or stop_id or \
hybrid_fla_and_torch_backends_agree or static_cache_decode_step_replays}" \
          > "$OUT/pytest_mla.log" 2>&1
        note "mla-decode tests: $(grep -E 'passed|failed|error' "$OUT/pytest_mla.log" | tail -1)"
      fi
      for run in "${runs[@]}"; do
        r=${run%%:*} left=$(( ${DEADLINE:-480} - SECONDS ))
        [ "$left" -lt 60 ] && { note "mla-decode $r: not run ($left s left)"; continue; }
        timeout "$left" python3 -m zebra.cli.main bench decode "$r" --batch 1 "${size[@]}" --no-hf ${run#*:} --json \
          > "$OUT/decode_mla_$r.json" 2>> "$log"
        note "mla-decode $r (${run#*:}) rc=$?"
      done
      python3 scripts/mla-decode-summary.py "$OUT" >> "$OUT/summary.txt";;
    fused-decode)  # issue 41 item 1: the decode step with Zebra's GEMV kernels (the norms and SwiGLU
      # inside, `--fused-decode`) against cuBLAS's, each recipe of FUSED_RECIPES at batch 1 and 8 with its step
      # profile, base then fused in this call (same machine): decode_mla_<recipe>-{base,fused}.json, summed up by
      # scripts/mla-decode-summary.py; first the kernel's and the fused engine's GPU tests (FUSED_TESTS=0 skips).
      # FUSED_DRY=1: tiny recipes on the CPU (no tests), to check the phase without a GPU.
      dry=${FUSED_DRY:-0} size=(--batch 1,8 --prompt 2048 --new 256) recipes=(${FUSED_RECIPES:-1b-mamba-mla 1b-gdn-pure})
      [ "$dry" = 1 ] && { size=(--batch 1,2 --prompt 16 --new 4 --device cpu --dtype fp32); recipes=(tiny tiny-gdn); }
      if [ "$dry" != 1 ] && [ "${FUSED_TESTS:-1}" = 1 ]; then
        timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -v -rA --timeout 190 \
          tests/kernels/test_kernel_gpu.py tests/generation/test_gpu.py -k "decode_gemv or decode_gated_norm_gemv or fused_decode or argmax_rows or cuda_graph_decode_equals_eager" \
          > "$OUT/pytest_fused.log" 2>&1
        note "fused-decode tests: $(grep -E 'passed|failed|error' "$OUT/pytest_fused.log" | tail -1)"
      fi
      [ "$dry" != 1 ] && { timeout 120 python3 scripts/gemv-bench.py --json 2>> "$log" >> "$OUT/summary.txt"
        note "fused-decode gemv-bench rc=$?"; }
      for r in "${recipes[@]}"; do
        for mode in base fused; do
          left=$(( ${DEADLINE:-480} - SECONDS ))
          [ "$left" -lt 60 ] && { note "fused-decode $r $mode: not run ($left s left)"; continue; }
          flag=(); [ "$mode" = fused ] && flag=(--fused-decode)
          timeout "$left" python3 -m zebra.cli.main bench decode "$r" "${size[@]}" --no-hf --profile "${flag[@]}" \
            --json > "$OUT/decode_mla_$r-$mode.json" 2>> "$log"
          note "fused-decode $r $mode rc=$?"
        done
      done
      python3 scripts/mla-decode-summary.py "$OUT" >> "$OUT/summary.txt";;
    longctx)
      long() {  # long LABEL ARGS...: one `zebra ... --json` report, under a '## LABEL rc=N' line, into long.jsonl
        local label=$1 left=$(( ${DEADLINE:-100000} - SECONDS )) rc; shift
        [ "$left" -lt 90 ] && { note "longctx $label: not run ($left s left)"; return; }
        timeout "$left" python3 -m zebra.cli.main "$@" --json > "$OUT/long.tmp" 2>> "$log"; rc=$?
        { echo "## $label rc=$rc"; cat "$OUT/long.tmp"; } >> "$OUT/long.jsonl"; rm -f "$OUT/long.tmp"
        note "longctx $label rc=$rc"
      }
      for len in ${LONG_LENGTHS:-8192 16384 32768}; do
        long "train 1b-gdn-pure $len" bench train 1b-gdn-pure --batch 1 --seq-len $len --steps 5 --warmup 2 --against fla
      done
      long_recipe() {  # long_recipe R: R with a 131072-token context (MLA's RoPE and the decode cache reach it)
        printf 'extends: %s\nmodel:\n  max_position_embeddings: 131072\n' "$1" > "/tmp/long-$1.yaml"; echo "/tmp/long-$1.yaml"
      }
      for r in ${LONG_HYBRIDS:-1b-mamba-mla 1b-kda-mla}; do
        # LONG_AC=1: both models recompute (Llama-3.2-1B's shape needs it at 32k on 80 GB)
        long "train $r ${LONG_HYBRID_LEN:-32768}" bench train "$(long_recipe $r)" --batch 1 \
          --seq-len ${LONG_HYBRID_LEN:-32768} --steps 5 --warmup 2 --against llama \
          --set train.activation_checkpointing=$([ "${LONG_AC:-0}" = 1 ] && echo true || echo false)
      done
      for r in ${LONG_DECODE_RECIPES:-1b-gdn-pure 1b-mamba-mla}; do
        long "decode $r ${LONG_PROMPT:-32768}" bench decode "$(long_recipe $r)" --batch 1 --prompt ${LONG_PROMPT:-32768} \
          --new 64 --no-hf --against llama
      done;;
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
    perf18)  # issue 18 items 3-4 in one call of about 8 minutes (DEADLINE=480), most wanted first: 1b-gdn-pure vs
      # FLA at batch 8 and 16 (the goals) and two levers, 1b-mamba-mla vs Llama and on mamba-ssm's scan, the scan alone
      perf 270 train 1b-gdn-pure base-b8 base-b16 fuse optgraph  # 150 s left no row on a cold Triton cache
      perf 130 train 1b-mamba-mla vs-llama mamba-ssm
      perf 70 ssd 1b-mamba-mla 256;;
    ssd)  # Mamba2 scan: FLA's simple-GLA path vs mamba-ssm's chunked kernel, fwd and fwd+bwd at 1b-mamba-mla shapes
      perf 240 ssd 1b-mamba-mla;;
    levers)  # 1b-gdn-pure vs FLA at batch 8 and 16 (the goals), then each lever alone (zebra row only)
      [ "${KERNELS:-1}" = 1 ] && perf 90 kernels 1b-gdn-pure  # our pre-norm and SwiGLU kernels against FLA's (seconds)
      perf ${LEVERS_SECONDS:-540} train 1b-gdn-pure ${LEVERS:-base-b8 base-b16 fuse optgraph ac-b16 compile-mlp fp8};;
    hybrids)  # 1b-mamba-mla (also on mamba-ssm's scan) and 1b-kda-mla vs Llama-3.2-1B's shape (HF SDPA)
      perf 300 train 1b-mamba-mla ${HYBRIDS_MAMBA:-vs-llama ssd-fla fuse-vs-llama}
      perf 400 train 1b-kda-mla ${HYBRIDS_KDA:-vs-llama-2k};;
    tests-perf)  # the GPU tests of issue 18 items 3-4: mamba-ssm vs float64, its model path, the levers
      left=$(( ${DEADLINE:-100000} - SECONDS )); [ "$left" -gt 400 ] && left=400
      timeout "$left" python3 -m pytest -m gpu -p no:cacheprovider -v -rA -n ${WORKERS:-4} --timeout 300 \
        tests/kernels/test_kernel_gpu.py::test_mamba2_mamba_ssm_matches_reference tests/kernels/test_bench_ssd.py \
        tests/models/test_gpu.py::test_tiny_mamba_on_mamba_ssm_matches_torch_backend_with_gradients \
        tests/train/test_levers.py 2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -30
      note "tests-perf: $(grep -E 'passed|failed|error' "$OUT/pytest_gpu.log" | tail -1)";;
    figures)  # issues 13/14: upcycle-figure.py then pipeline-figure.py on FIG_DATA (python-docs-data.py's train,
      # heldout, tokenizer) and FIG_TEACHER (the GGUF); FIG_ARGS go to both; figure.json/png come back renamed
      data=${FIG_DATA:-data/pydocs-smol} teacher=${FIG_TEACHER:-SmolLM2-135M-Instruct.Q4_1.gguf}
      for script in ${FIG_SCRIPTS:-upcycle pipeline}; do
        left=$(( ${DEADLINE:-570} - SECONDS )); [ "$left" -lt 90 ] && { note "figure $script: not run ($left s left)"; continue; }
        timeout "$left" python3 scripts/$script-figure.py "$teacher" --train "$data/train" --heldout "$data/heldout" \
          --output /tmp/fig-$script ${FIG_ARGS:-} 2>> "$log" | tee -a "$OUT/figures.txt"
        note "figure $script rc=${PIPESTATUS[0]}"
        for f in /tmp/fig-$script/*.json /tmp/fig-$script/*.png; do [ -f "$f" ] && cp "$f" "$OUT/$script-$(basename "$f")"; done
      done;;
    distill)  # issue 40: scripts/distill-figure.py runs side by side (the student leaves most of the GPU idle), each
      # its own process, --output and log under DISTILL_DIR, resumed by the next call with the same DISTILL_RUNS
      : "${DISTILL_RUNS:=p50m s50m c10m}" "${DISTILL_MICRO:=8}" "${DISTILL_MLA_LAYERS:=0,4,8,12,16,20,24,28}"
      Z=${DISTILL_DIR:-/tmp/zfig}; teacher=${DISTILL_TEACHER:-$Z/SmolLM2-135M-Instruct.Q4_1.gguf}; shape=$Z/shape
      # the scratch twins' shape and tokenizer: the hybrid upcycled without calibration (step 0's config)
      if [[ " $DISTILL_RUNS " =~ \ s[0-9]+m\  ]] && [ ! -f "$shape/config.json" ]; then
        zebra upcycle "$teacher" --mixer mamba --mla-layers "$DISTILL_MLA_LAYERS" -o "$shape" -f --yes >> "$log" 2>&1
      fi
      declare -A runs=(
        [p50m]="--tokens 50M --mixers mamba2 --scratch none --ild-fraction 0 --kd-lr 3e-4"
        [s50m]="--tokens 50M --mixers none --scratch mamba2 --shape-from $shape --ild-fraction 0"
        [s10m]="--tokens 10M --mixers none --scratch mamba2 --shape-from $shape --ild-fraction 0"
        [c10m]="--tokens 10M --mixers mamba2 --scratch none --ild-fraction 0 --kd-lr 3e-4"
        [a10m]="--tokens 10M --mixers mamba2 --scratch none --ild-fraction 0 --kd-lr 1e-3"
        [g10m]="--tokens 10M --mixers gdn --ild-fraction 0 --kd-lr 3e-4"
      )
      for run in c10m a10m; do  # p50m's calibrated students, when p50m runs too (keep DISTILL_RUNS from call to call)
        [[ " $DISTILL_RUNS " == *" p50m "* ]] && runs[$run]+=" --upcycled-from $Z/p50m"
      done
      figure() {  # RUN [more flags]: one run of distill-figure.py, appending to its log
        local run=$1; shift
        python3 scripts/distill-figure.py "$teacher" --data "$Z/data" --eval-examples 300 --micro-batch "$DISTILL_MICRO" \
          ${runs[$run]} ${DISTILL_ARGS:-} --output "$Z/$run" "$@" >> "$Z/$run.log" 2>&1
      }
      upcycled() {  # OUT: its mamba2 pipeline's upcycle stages are done
        python3 -c "import json, sys; s = json.load(open(sys.argv[1]))['stages']; \
sys.exit(any(s.get(n, {}).get('status') != 'done' for n in ('upcycle-mla', 'upcycle-rec')))" \
          "$1/distill-mamba2/stages.json" 2>/dev/null
      }
      deadline=${DEADLINE:-540}; pids=()
      for run in $DISTILL_RUNS; do  # a run --upcycled-from another starts once that one's students are calibrated
        from=$(grep -oP -- '--upcycled-from \K\S+' <<< "${runs[$run]}")
        ( while [ -n "$from" ] && ! upcycled "$from" && [ "$SECONDS" -lt $(( deadline - 120 )) ]; do sleep 10; done
          figure "$run" --deadline-seconds $(( deadline - SECONDS )) ) & pids+=($!)
      done
      wait "${pids[@]}"
      done_() { grep -q "figure complete" "$Z/$1.log" 2>/dev/null; }
      joins=(); done_ s50m && joins+=(--include "$Z/s50m"); done_ c10m && joins+=(--include "$Z/c10m=10M")
      if done_ p50m && [ ${#joins[@]} -gt 0 ]; then figure p50m "${joins[@]}"; fi  # the 50M pipeline, its twin, 10M
      if done_ c10m && done_ s10m; then figure c10m --include "$Z/s10m"; fi  # the 10M pipeline and its twin
      for run in $DISTILL_RUNS; do note "distill $run: $(grep -E 'figure complete|same command again|Error|error:' "$Z/$run.log" | tail -1)"; done
      (cd "$Z" && find . -maxdepth 4 \( -name '*.json' -o -name '*.log' -o -name 'metrics.jsonl' -o -name '*.png' \) \
        -not -path '*/export/*' -not -path '*/checkpoints/*' -not -path './data/*' -not -path '*/teacher-hf/*' \
        -not -path './shape/*' -not -name 'tokenizer*' -not -name '*config.json' | tar czf "$OUT/distill.tgz" -T -);;
    calibrate)  # issue 40: the step-0 students of zebra distill's calibration, timed, on the pack in CAL_DIR (/tmp/zs:
      # pack-corpus.py's data/ and the teacher GGUF): the all-MLA (or CAL_MLA's) and all-recurrent (CAL_MIXER)
      # students calibrated on CAL_ARGS (128 x 512 tokens, 600 steps of 8 a layer) with the default processes,
      # composed with 8 MLA layers even and smart, their held-out CE beside the teacher's; then the recurrent
      # calibration at CAL_ANCHOR_STEPS (100) steps with each of CAL_ANCHORS' process counts (1 8) on the one GPU
      Z=${CAL_DIR:-/tmp/zs}; T=$Z/SmolLM2-135M-Instruct.Q4_1.gguf
      : "${CAL_ARGS:=--calibrate-samples 128 --calibrate-seq-len 512 --calibrate-steps 600 --calibrate-batch 8}"
      timed() {  # NAME ARGS...: zebra ARGS..., its wall seconds noted
        local t=$SECONDS name=$1; shift
        zebra "$@" --device "${CAL_DEVICE:-cuda}" -f --yes --json > "$OUT/cal-$name.json" 2>> "$log"
        note "calibrate $name: rc=$? $((SECONDS - t)) s"
      }
      mixer=${CAL_MIXER:-mamba} mla=${CAL_MLA:-$Z/mla}
      [ -n "${CAL_MLA:-}" ] || timed mla upcycle "$T" --mla-layers all --calibrate "$Z/data" $CAL_ARGS \
        ${CAL_MLA_ARGS:-} -o "$mla"  # e.g. CAL_MLA_ARGS="--svd activation --calibration $Z/data"
      timed "rec-$mixer" upcycle "$T" --mla 0 --mixer "$mixer" --calibrate "$Z/data" $CAL_ARGS -o "$Z/rec-$mixer"
      zebra upcycle --compose "$mla" "$Z/rec-$mixer" --mla 8 --placement even -o "$Z/even" -f --yes >> "$log" 2>&1
      zebra upcycle --compose "$mla" "$Z/rec-$mixer" --mla 8 --placement smart --calibration "$Z/data" \
        --calibration-samples 64 -o "$Z/smart" -f --yes >> "$log" 2>&1
      python3 scripts/heldout-ce.py "$Z/data" "$T" "$Z/even" "$Z/smart" 2>> "$log" | tee "$OUT/cal-ce.jsonl"
      for w in ${CAL_ANCHORS-1 8}; do  # the anchor: one process, then eight sharing the GPU (the default up to f0c1682)
        [ $(( ${DEADLINE:-100000} - SECONDS )) -lt 200 ] && { note "calibrate anchor workers=$w: not run (DEADLINE)"; continue; }
        timed "anchor-w$w" upcycle "$T" --mla 0 --mixer "$mixer" --calibrate "$Z/data" $CAL_ARGS \
          --calibrate-steps "${CAL_ANCHOR_STEPS:-100}" --calibrate-workers $w -o "$Z/anchor-w$w"
      done
      [ -f "$Z/smart/upcycle.json" ] && cp "$Z/smart/upcycle.json" "$OUT/upcycle-smart.json";;  # its scores
    kd-speed)  # issue 40: KD's step rate by micro-batch and lever, so that the 50M pipeline fits its 15 minutes
      Z=${CAL_DIR:-/tmp/zs}; T=$Z/SmolLM2-135M-Instruct.Q4_1.gguf; init=$Z/kd-init; runs=/tmp/kd-speed
      [ -f "$init/config.json" ] || zebra upcycle "$T" --mixer mamba --mla-layers 0,4,8,12,16,20,24,28 -o "$init" \
        -f --yes >> "$log" 2>&1
      for v in ${KD_VARIANTS:-8 16 32 16:train.compile=true}; do
        micro=${v%%:*} sets=() kvs=() left=$(( ${DEADLINE:-100000} - SECONDS ))
        [[ $v == *:* ]] && IFS=, read -ra kvs <<< "${v#*:}"; for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
        [ "$left" -lt 60 ] && { note "kd-speed $v: not run ($left s left)"; continue; }
        rm -rf "$runs/kd"; t=$SECONDS
        timeout "$left" python3 -m zebra.cli.main train tiny --init "$init" --teacher "$T" --data "$Z/data" -o "$runs" \
          --run kd --max-steps "${KD_STEPS:-12}" --yes --set data.tokenizer="$init" --set data.seq_len="${KD_SEQ:-2048}" \
          --set train.global_batch_size=$(( micro > 16 ? micro : 16 )) --set train.micro_batch_size="$micro" \
          --set train.precision="${KD_PRECISION:-bf16}" --set train.eval_interval=0 --set train.save_interval=0 \
          --set train.export=false --set train.log_interval=1 "${sets[@]}" >> "$log" 2>&1
        rc=$?
        python3 -c "import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if 'tokens_per_s' in r][3:]
tps = statistics.median(r['tokens_per_s'] for r in rows) if rows else None
mfu = statistics.median(r['mfu'] or 0 for r in rows) if rows else None
print(json.dumps({'variant': sys.argv[2], 'rc': int(sys.argv[3]), 'seconds': int(sys.argv[4]), 'steps': len(rows),
                  'tokens_per_s': tps, 'mfu': mfu, 'memory_gb': max((r['memory_gb'] for r in rows), default=None)}))" \
          "$runs/kd/metrics.jsonl" "$v" "$rc" $(( SECONDS - t )) 2>> "$log" | tee -a "$OUT/kd-speed.jsonl"
      done;;
    save-kernels)
      rm -f "$OUT"/kernels.tgz.*
      tar -czP -f - /tmp/triton-cache "$HOME/.cache/zebra/kernels" 2>> "$log" | split -b 12000000 -d -a 2 - "$OUT/kernels.tgz."
      n=$(ls "$OUT"/kernels.tgz.* | wc -l)
      [ "$n" -gt 5 ] && { rm -f "$OUT"/kernels.tgz.*; note "save-kernels: $n parts of 12 MB, more than come back (5): dropped"; }
      note "save-kernels: $n part(s), $(du -sh /tmp/triton-cache "$HOME/.cache/zebra/kernels" 2>/dev/null | cut -f1 | tr '\n' ' ')unpacked";;
    *) note "unknown phase $phase";;
  esac
  note "phase $phase: $((SECONDS - t0)) s"
done
[ -s "$OUT/perf.jsonl" ] && python3 scripts/gpu-perf.py table "$OUT/perf.jsonl" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
