#!/usr/bin/env bash
# One run on a GPU machine: build (Release, Ninja, CUDA for sm_90a), run the tests, run
# compute-sanitizer (memcheck, racecheck, initcheck) on a representative subset, benchmark with the
# `qsdpa` program when it exists, and record the device. Usage:
#
#   scripts/prepare_gpu_deps.sh          # on the development machine, once: fills .deps/
#   scripts/gpu_run.sh OUTDIR            # on the GPU machine, from anywhere
#
# Everything lands in OUTDIR: summary.txt, bench.json, bench_cold.json (the same sweep with
# --cold-l2; QSDPA_GPU_COLD=0 skips it), with QSDPA_GPU_SERVING=1 serving.jsonl and
# cpu.txt, with QSDPA_GPU_EXPERIMENTS=1 stride.txt, logits.txt and first_touch.txt (tools/experiments), with
# QSDPA_GPU_NCU=1 ncu.txt, with QSDPA_GPU_NCU_CACHE=1 ncu_cache.txt (D=512 and D=256
# kernel durations with and without ncu's L2 flush), with QSDPA_GPU_NCU_STALLS=1 ncu_stalls.txt (the warp
# states of the shapes that miss their targets), with QSDPA_GPU_TUNE tune.jsonl, and logs.tgz (build,
# ctest, sanitizer, bench, nvidia-smi and the other logs, with QSDPA_GPU_NCU_SOURCE=1 also the executed
# instructions per SASS line of the headline kernel, ncu_source.csv; QSDPA_GPU_PACK=0 leaves them
# as plain files, but the device tool brings back at most 8 files of OUTDIR: in runs 95 and 97
# (2026-12-06) tune.jsonl, tune.log and trace.txt stayed behind that way), with QSDPA_GPU_TRACE=1 trace.txt and traces.tgz (per-block timelines of a
# -DQSDPA_MMA_TRACE=1 build on the bench's shapes). QSDPA_GPU_CUDA_FLAGS builds the main build (and
# so the tests) with knobs; QSDPA_GPU_CTEST_REGEX / QSDPA_GPU_CTEST_REST=0 narrow the tests;
# QSDPA_GPU_SANITIZE=0 skips compute-sanitizer (timing-only runs). Each step has a time limit
# taken from what is left of QSDPA_GPU_BUDGET seconds (default 450), so the run ends in time and
# summary.txt always says what ran and what did not. The build keeps 150 of them for the later
# steps (QSDPA_GPU_BUILD_RESERVE): a budget under ~250 starves it (run 101's 170 left it 20 s); on
# the H200 machine of run 103 (16 jobs) the whole build took 52 s, so a short run (narrowed tests,
# no sanitizers) may set the reserve to ~60 and the budget to ~200. scripts/gpu_mutants.sh runs
# after it, in the same build folder.
set -uo pipefail

out="${1:?usage: scripts/gpu_run.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${QSDPA_GPU_BUILD:-build-gpu}"
budget="${QSDPA_GPU_BUDGET:-450}"
reserve="${QSDPA_GPU_BUILD_RESERVE:-150}"  # seconds of the budget the build leaves to the later steps
start=$(date +%s)
summary="$out/summary.txt"
: >"$summary"

say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start)); }
# Seconds a step may take: its own cap, but never past the budget (minus a reserve for the rest).
limit() {
  local cap=$1 reserve=${2:-10} left
  left=$((budget - $(elapsed) - reserve))
  [ "$left" -lt 5 ] && left=5
  [ "$cap" -lt "$left" ] && echo "$cap" || echo "$left"
}

say "qsdpa GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') ($(git status --porcelain 2>/dev/null | wc -l) paths of the tree differ from it: the device machine's copy may carry an older .git)"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null |
  sed 's/^/gpu: /' | tee -a "$summary"
say "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
[ -n "${QSDPA_GPU_CUDA_FLAGS:-}" ] && say "main build with CUDA flags: $QSDPA_GPU_CUDA_FLAGS"

# ---- build (and, with QSDPA_GPU_TUNE, the tuning variants beside it) ----------------------------
tune_pid=""
if [ -n "${QSDPA_GPU_TUNE:-}" ]; then
  read -r -a tv <<<"$QSDPA_GPU_TUNE"
  tv=("${tv[@]//+/ }")
  # (niced: the main build and the tests come first; in run 41 three variants at equal priority
  # kept the main build from linking within its limit)
  nice -n 15 bash scripts/gpu_tune.sh build "$out" "${tv[@]}" >/dev/null 2>&1 &
  tune_pid=$!
fi
trace_pid=""
if [ "${QSDPA_GPU_TRACE:-0}" = 1 ]; then  # the block-trace build (-DQSDPA_MMA_TRACE=1), never timed
  # (with the main build's knobs, QSDPA_GPU_CUDA_FLAGS, so that the traces show the code it times)
  tflags="-DQSDPA_MMA_TRACE=1 ${QSDPA_GPU_CUDA_FLAGS:-}"
  nice -n 15 bash scripts/gpu_tune.sh build "$out" "trace=${tflags% }" >/dev/null 2>&1 &
  trace_pid=$!
fi
deps_flag=()
[ -d "$root/.deps" ] && deps_flag=(-DQSDPA_DEPS_DIR="$root/.deps")
jobs=$(nproc)
{
  # (QSDPA_GPU_CUDA_FLAGS: knobs for the main build, so that the tests run on them, e.g.
  # '-DQSDPA_MMA_MERGE_BATCH=1')
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSDPA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a-real -DQSDPA_TEST_MLX=OFF "${deps_flag[@]}" \
    "-DCMAKE_CUDA_FLAGS=${QSDPA_GPU_CUDA_FLAGS:-}" \
    -DQSDPA_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" &&
    timeout "$(limit 300 "$reserve")" cmake --build "$build" -j"$jobs"
} >"$out/build.log" 2>&1
build_rc=$?
if [ $build_rc -ne 0 ]; then
  say "build: FAILED (rc $build_rc) after $(elapsed) s; building the CUDA tests alone"
  grep -E "error|FAILED" "$out/build.log" | head -20 | sed 's/^/  /' | tee -a "$summary"
  timeout "$(limit 120 "$reserve")" cmake --build "$build" -j"$jobs" \
    --target test_cuda_attention test_cuda_runtime test_cuda_quantize >>"$out/build.log" 2>&1
  say "build of the CUDA tests: rc $?"
else
  say "build: ok in $(elapsed) s ($jobs jobs)"
fi

# ---- tests: the GPU tests first, then everything else --------------------------------------------
: >"$out/ctest.log"
# (QSDPA_GPU_CTEST_REGEX narrows the GPU part, e.g. to '^CudaRuntime' when only those tests
# changed since a full run of the same library code; QSDPA_GPU_CTEST_REST=0 skips the rest)
parts="gpu rest"
[ "${QSDPA_GPU_CTEST_REST:-1}" = 0 ] && parts=gpu
for part in $parts; do
  t0=$(elapsed)
  sel=(-R "${QSDPA_GPU_CTEST_REGEX:-^Cuda|/Cuda}")
  [ $part = rest ] && sel=(-E '^Cuda|/Cuda')
  echo "===== ctest ($part) =====" >>"$out/ctest.log"
  timeout "$(limit 240 110)" ctest --test-dir "$build" -j"$jobs" --output-on-failure --timeout 300 "${sel[@]}" \
    >>"$out/ctest.log" 2>&1
  rc=$?
  say "ctest ($part): rc $rc in $(($(elapsed) - t0)) s: $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
done
grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception|Not Run)' "$out/ctest.log" | head -30 |
  sed 's/^/  /' | tee -a "$summary"
say "ctest skipped: $(grep -c '(Skipped)' "$out/ctest.log")"

# ---- compute-sanitizer --------------------------------------------------------------------------
san="$out/sanitizer.log"
: >"$san"
bin="$build/tests/test_cuda_attention"
qbin="$build/tests/test_cuda_quantize"
if [ "${QSDPA_GPU_SANITIZE:-1}" = 0 ]; then
  say "compute-sanitizer: not run (QSDPA_GPU_SANITIZE=0: a timing-only run)"
elif command -v compute-sanitizer >/dev/null && [ -x "$bin" ]; then
  for tool in memcheck racecheck initcheck; do
    t0=$(elapsed)
    echo "===== $tool =====" >>"$san"
    # (no --leak-check: the library keeps its workspace for the life of the process by design)
    timeout "$(limit 60 40)" compute-sanitizer --tool "$tool" --error-exitcode 17 \
      "$bin" --gtest_filter='CudaSanitize.*' >>"$san" 2>&1
    rc=$?
    say "compute-sanitizer $tool (CudaSanitize.*): rc $rc in $(($(elapsed) - t0)) s," \
      "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$san" | tail -1)"
  done
  if [ -x "$qbin" ]; then
    t0=$(elapsed)
    echo "===== memcheck quantize =====" >>"$san"
    timeout "$(limit 40 30)" compute-sanitizer --tool memcheck --error-exitcode 17 "$qbin" \
      --gtest_filter='CudaQuantize.StreamAndHostPointerError' >>"$san" 2>&1
    say "compute-sanitizer memcheck (quantize): rc $? in $(($(elapsed) - t0)) s"
  fi
  lbin="$build/tests/test_cuda_logits"
  if [ -x "$lbin" ]; then  # the two-pass study (pass 2 merges its warps in shared memory)
    t0=$(elapsed)
    echo "===== racecheck two-pass =====" >>"$san"
    timeout "$(limit 40 30)" compute-sanitizer --tool racecheck --error-exitcode 17 "$lbin" \
      --gtest_filter='CudaLogitsQK.TwoPassAttentionMatchesReference' >>"$san" 2>&1
    say "compute-sanitizer racecheck (two-pass study): rc $? in $(($(elapsed) - t0)) s," \
      "$(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$san" | tail -1)"
  fi
  sbin="$build/tests/test_cuda_serving"
  if [ -x "$sbin" ]; then  # the serving layouts: paged, strided, lengths (both kernels), append
    t0=$(elapsed)
    echo "===== memcheck serving =====" >>"$san"
    timeout "$(limit 60 30)" compute-sanitizer --tool memcheck --error-exitcode 17 "$sbin" \
      --gtest_filter='Cases/CudaServingMma.TensorCoreLayouts/10:Cases/CudaServingMma.TensorCoreLayouts/13:Cases/CudaServingMma.TensorCoreLayouts/17:Cases/CudaServingMma.TensorCoreLayouts/19:Cases/CudaServing.HostCases/20:Cases/CudaServing.HostCases/23:CudaAppend.*:CudaDecodeLoop.*' \
      >>"$san" 2>&1
    say "compute-sanitizer memcheck (serving): rc $? in $(($(elapsed) - t0)) s," \
      "$(grep -E 'ERROR SUMMARY' "$san" | tail -1)"
  fi
else
  say "compute-sanitizer: not run (tool or $bin missing)"
fi

# ---- benchmark ----------------------------------------------------------------------------------
if [ -n "$tune_pid" ]; then  # nothing else may run on the machine while it is timed
  t0=$(elapsed)
  wait "$tune_pid"
  say "tuning variants built (waited $(($(elapsed) - t0)) s)"
fi
if [ -n "$trace_pid" ]; then
  t0=$(elapsed)
  wait "$trace_pid"
  say "trace build done (waited $(($(elapsed) - t0)) s)"
fi
cli="$build/tools/qsdpa"
# Each shape's time, PyTorch's, and the library's plan for it (kernel, tile pool, splits, merge).
bench_lines() {
  python3 - "$1" <<'PY' 2>&1 | sed 's/^/  /' | tee -a "$summary"
import json, sys
try:
    recs = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[1]} unreadable: {e}"); sys.exit(0)
for r in recs:
    p = r.get("plan", {})
    t = f", PyTorch {r['torch_time_us']:.1f} ({r['speedup_vs_torch']:.2f}x)" if "speedup_vs_torch" in r else ""
    print(f"B={r['B']} Hq={r['Hq']} Hkv={r['Hkv']} Lq={r['Lq']} N={r['N']} D={r['D']} {r['k_bits']}/{r['v_bits']}-bit: "
          f"{r.get('time_us', 0):.1f} us ({100 * r.get('frac_copy', 0):.1f} %{t}); "
          f"{'tensor cores' if p.get('tensor_cores') else 'generic'}, pool {p.get('pool_warps', '?')} warps, "
          f"{p.get('splits', '?')} splits, merge {p.get('merge', '?')}")
PY
}
if [ -x "$cli" ]; then
  t0=$(elapsed)
  timeout "$(limit 90 5)" "$cli" bench --backend cuda --json >"$out/bench.json" 2>"$out/bench.log"
  say "bench: rc $? in $(($(elapsed) - t0)) s ($(wc -c <"$out/bench.json") bytes of JSON)"
  bench_lines "$out/bench.json"
  # The same sweep with --cold-l2 (QSDPA_GPU_COLD=0 skips it): before each call, ours and
  # PyTorch's, a read of twice the L2 of other data, as in a model; no shape inherits the cache
  # from the one before it (docs/PERF.md, runs 104-106).
  if [ "${QSDPA_GPU_COLD:-1}" = 1 ]; then
    t0=$(elapsed)
    timeout "$(limit 60 60)" "$cli" bench --backend cuda --json --cold-l2 >"$out/bench_cold.json" 2>>"$out/bench.log"
    say "bench --cold-l2: rc $? in $(($(elapsed) - t0)) s ($(wc -c <"$out/bench_cold.json") bytes of JSON)"
    bench_lines "$out/bench_cold.json"
  fi
else
  say "bench: not run ($cli missing)"
fi

# ---- experiments (QSDPA_GPU_EXPERIMENTS=1): the read orders of wide key rows (stride.txt) and the
# two-pass study (logits.txt), both in tools/experiments; docs/PERF.md after runs 109-110 -------
if [ "${QSDPA_GPU_EXPERIMENTS:-0}" = 1 ]; then
  for x in stride logits first_touch; do
    if [ -x "$build/tools/qsdpa_${x}_bench" ]; then
      timeout "$(limit 60 30)" "$build/tools/qsdpa_${x}_bench" >"$out/$x.txt" 2>&1
      say "qsdpa_${x}_bench: rc $?"
      sed 's/^/  /' "$out/$x.txt" | tee -a "$summary"
    else
      say "qsdpa_${x}_bench: not built"
    fi
  done
fi

# ---- serving layouts next to contiguous caches, and the host CPU (QSDPA_GPU_SERVING=1) ----------
if [ "${QSDPA_GPU_SERVING:-0}" = 1 ] && [ -x "$cli" ]; then
  t0=$(elapsed)
  {
    for round in 1 2; do  # two interleaved rounds: run-to-run noise is a few percent
      for bits in 4 8; do
        for pg in 0 16 32 64 128 256; do
          "$cli" bench --backend cuda --no-torch --jsonl --B 8 --N 32768 --bits $bits --paged $pg
        done
      done
    done
    "$cli" bench --backend cuda --no-torch --jsonl --kv-lens 1,17,100000
    "$cli" bench --backend cuda --no-torch --jsonl --B 1 --N 100000
    "$cli" bench --backend cuda --no-torch --jsonl --kv-lens 1,17,100000 --paged 64
    "$cli" bench --backend cuda --no-torch --jsonl --B 8 --N 32768 --k-bits 8 --v-bits 4
    "$cli" bench --backend cuda --no-torch --jsonl --B 8 --N 32768 --k-bits 8 --v-bits 4 --paged 64
    for pg in 0 16 64; do
      "$cli" bench --backend cuda --no-torch --jsonl --B 8 --N 32768 --bits 2 --paged $pg
    done
  } >"$out/serving.jsonl" 2>"$out/serving.log"
  say "serving bench: rc $? in $(($(elapsed) - t0)) s"
  t0=$(elapsed)
  { lscpu; echo; taskset -c 0,1 "$cli" bench --backend cpu --threads 2 --N 8192 --bits 4;
    taskset -c 0,1 "$cli" bench --backend cpu --threads 2 --N 8192 --bits 8;
    taskset -c 0 "$cli" bench --backend cpu --threads 1 --N 8192 --bits 4; } >"$out/cpu.txt" 2>&1
  say "cpu bench (2 cores of this host): rc $? in $(($(elapsed) - t0)) s"
fi

# ---- per-kernel profile (QSDPA_GPU_NCU=1): durations of the small decode step's two kernels, and
# the headline 4-bit kernel's stall reasons and occupancy -------------------------------------------
if [ "${QSDPA_GPU_NCU:-0}" = 1 ] && [ -x "$cli" ] && command -v ncu >/dev/null; then
  t0=$(elapsed)
  {
    echo "===== B=1 N=4096 4-bit: per-kernel durations ====="
    timeout "$(limit 60 20)" ncu --clock-control none -k regex:'attention_kernel|combine_kernel' \
      --launch-skip 20 --launch-count 4 \
      --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers \
      "$cli" bench --backend cuda --no-torch --B 1 --N 4096 --bits 4 --iters 20
    for shape in "--B 32 --N 4096" "--B 1 --N 131072" "--B 4 --Hq 16 --Hkv 1 --D 512 --N 32768"; do
      echo "===== $shape 4-bit: per-kernel durations ====="
      timeout "$(limit 60 20)" ncu --clock-control none -k regex:'attention_kernel|combine_kernel' \
        --launch-skip 20 --launch-count 2 --metrics gpu__time_duration.sum,launch__grid_size \
        "$cli" bench --backend cuda --no-torch $shape --bits 4 --iters 20
    done
    echo "===== B=1 N=4096 4-bit: attention kernel, details ====="
    timeout "$(limit 60 20)" ncu --clock-control none -k regex:attention_kernel --launch-skip 20 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
      "$cli" bench --backend cuda --no-torch --B 1 --N 4096 --bits 4 --iters 20
    echo "===== D=512 B=4 N=32768 4-bit: combine kernel, details ====="
    timeout "$(limit 60 20)" ncu --clock-control none -k regex:combine_kernel --launch-skip 12 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
      "$cli" bench --backend cuda --no-torch --B 4 --Hq 16 --Hkv 1 --D 512 --N 32768 --bits 4 --iters 5
    echo "===== D=512 B=4 N=32768 4-bit: attention kernel, details ====="
    timeout "$(limit 60 20)" ncu --clock-control none -k regex:attention_kernel --launch-skip 12 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
      "$cli" bench --backend cuda --no-torch --B 4 --Hq 16 --Hkv 1 --D 512 --N 32768 --bits 4 --iters 5
    echo "===== B=8 N=32768 4-bit: attention kernel, details ====="
    timeout "$(limit 90 20)" ncu --clock-control none -k regex:attention_kernel --launch-skip 12 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section LaunchStats --section MemoryWorkloadAnalysis \
      "$cli" bench --backend cuda --no-torch --B 8 --N 32768 --bits 4 --iters 5
  } >"$out/ncu.txt" 2>&1
  say "ncu: rc $? in $(($(elapsed) - t0)) s"
fi

# ---- per-kernel durations with and without ncu's cache flush (QSDPA_GPU_NCU_CACHE=1): the D=512
# and D=256 4-bit calls' two kernels, for the main build and each tuning variant, each kernel once
# with --cache-control all (L2 flushed before it: code and partials come from DRAM) and once with
# none (the L2 as the previous kernel left it), in ncu_cache.txt: whether the combine's tail is
# its code's and partials' fetch (PERF.md, run 93) ------------------------------------------------
if [ "${QSDPA_GPU_NCU_CACHE:-0}" = 1 ] && [ -x "$cli" ] && command -v ncu >/dev/null; then
  t0=$(elapsed)
  {
    for v in base ${QSDPA_GPU_NCU_CACHE_VARIANTS:-}; do
      vbin="$cli"
      [ "$v" != base ] && vbin="build-tune-$v/tools/qsdpa"
      [ -x "$vbin" ] || { echo "===== $v: $vbin missing"; continue; }
      for shape in "--B 4 --Hq 16 --Hkv 1 --D 512 --N 32768" "--B 4 --Hq 16 --Hkv 2 --D 256 --N 32768"; do
        for cc in all none; do
          echo "===== $v: $shape 4-bit, --cache-control $cc ====="
          timeout "$(limit 40 20)" ncu --clock-control none --cache-control $cc \
            -k regex:'attention_kernel|combine_kernel' --launch-skip 20 --launch-count 6 \
            --metrics gpu__time_duration.sum "$vbin" bench --backend cuda --no-torch $shape --bits 4 --iters 20 |
            grep -E 'attention_kernel|combine_kernel|gpu__time_duration|Error|error'
        done
      done
    done
  } >"$out/ncu_cache.txt" 2>&1
  say "ncu cache-control: rc $? in $(($(elapsed) - t0)) s"
fi

# ---- executed instructions and stall samples per SASS line of the attention kernel
# (QSDPA_GPU_NCU_SOURCE=1): where the issue slots and the waits of the token loop go. The shapes:
# QSDPA_GPU_NCU_SOURCE_SHAPES, 'name|bench flags' lines (default: the headline 4-bit, into
# ncu_source.csv; a named shape goes to ncu_source_NAME.csv), or the one shape of
# QSDPA_GPU_NCU_SOURCE_SHAPE (e.g. '--B 8 --N 32768 --Lq 4 --bits 4') --------------------------
if [ "${QSDPA_GPU_NCU_SOURCE:-0}" = 1 ] && [ -x "$cli" ] && command -v ncu >/dev/null; then
  t0=$(elapsed)
  : >"$out/ncu_source.log"
  while IFS='|' read -r name shape; do
    [ -z "$shape" ] && continue
    [ "$(limit 60 20)" -lt 30 ] && break
    csv="$out/ncu_source${name:+_$name}.csv"
    {
      echo "===== ${name:-headline}: $shape ====="
      timeout "$(limit 90 20)" ncu --clock-control none -k regex:attention_kernel --launch-skip 12 --launch-count 1 \
        --section SourceCounters --section InstructionStats -f -o "$out/ncu_src" \
        "$cli" bench --backend cuda --no-torch $shape --iters 5 &&
        ncu -i "$out/ncu_src.ncu-rep" --page source --csv --print-source sass >"$csv" &&
        ncu -i "$out/ncu_src.ncu-rep" --page details --section InstructionStats
    } >>"$out/ncu_source.log" 2>&1
    say "ncu source counts ${name:-headline}: rc $? ($(wc -l <"$csv" 2>/dev/null || echo 0) lines)"
    rm -f "$out/ncu_src.ncu-rep"
  done <<<"${QSDPA_GPU_NCU_SOURCE_SHAPES:-|${QSDPA_GPU_NCU_SOURCE_SHAPE:---B 8 --N 32768 --bits 4}}"
  say "ncu source counts: $(($(elapsed) - t0)) s"
fi

# ---- stall breakdown of the attention kernel (QSDPA_GPU_NCU_STALLS=1): ncu's warp states,
# scheduler statistics and occupancy on the shapes of QSDPA_GPU_NCU_STALL_SHAPES ('name|bench
# flags' lines), for the main build and for each tuning variant named in
# QSDPA_GPU_NCU_STALL_VARIANTS (built by QSDPA_GPU_TUNE), in ncu_stalls.txt: what the warps of
# the shapes that miss their targets wait on (PERF.md, runs 55-57) -------------------------------
if [ "${QSDPA_GPU_NCU_STALLS:-0}" = 1 ] && [ -x "$cli" ] && command -v ncu >/dev/null; then
  t0=$(elapsed)
  {
    for v in base ${QSDPA_GPU_NCU_STALL_VARIANTS:-}; do
      vbin="$cli"
      [ "$v" != base ] && vbin="build-tune-$v/tools/qsdpa"
      if [ ! -x "$vbin" ]; then echo "===== $v: $vbin missing"; continue; fi
      while IFS='|' read -r name shape; do
        [ -z "$name" ] && continue
        [ "$(limit 60 20)" -lt 30 ] && break
        echo "===== $v: $name ($shape) ====="
        timeout "$(limit 60 20)" ncu --clock-control none -k regex:attention_kernel --launch-skip 12 --launch-count 1 \
          --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --page raw \
          "$vbin" bench --backend cuda --no-torch $shape --iters 5 |
          grep -E '=====|attention_kernel|stall|warps_active|warps_eligible|issue_active|inst_issued|inst_executed|registers|occupancy|gpu__time_duration|cycles_active|Error|error'
      done <<<"${QSDPA_GPU_NCU_STALL_SHAPES:-d256|--B 4 --Hq 16 --Hkv 2 --D 256 --N 32768 --bits 4
b8q2|--B 8 --N 32768 --bits 2
lq4|--B 8 --N 32768 --Lq 4 --bits 4
b8|--B 8 --N 32768 --bits 4}"
    done
  } >"$out/ncu_stalls.txt" 2>&1
  say "ncu stalls: rc $? in $(($(elapsed) - t0)) s"
fi

# ---- tuning variants (QSDPA_GPU_TUNE='name=flags ...', rounds QSDPA_GPU_TUNE_ROUNDS) ----------
if [ -n "${QSDPA_GPU_TUNE:-}" ]; then
  t0=$(elapsed)
  timeout "$(limit 400 5)" bash scripts/gpu_tune.sh bench "$out" "${QSDPA_GPU_TUNE_ROUNDS:-2}" "${tv[@]}" \
    -- ${QSDPA_GPU_TUNE_FLAGS:-} >/dev/null 2>&1
  say "tune: rc $? in $(($(elapsed) - t0)) s"
  sed 's/^/  /' "$out/tune.log" | grep -v '^  round' | tee -a "$summary" >/dev/null
fi

# ---- block traces (QSDPA_GPU_TRACE=1): when each block of the tensor-core kernel starts, ends its
# token loop and ends, on the bench's shapes (trace_*.jsonl, summarized in trace.txt) -------------
tcli="build-tune-trace/tools/qsdpa"
if [ -n "$trace_pid" ] && [ -x "$tcli" ]; then
  t0=$(elapsed)
  : >"$out/trace.txt"
  # (a line is name|bench flags, or name|bench flags|VAR=VALUE ... for the library's environment)
  while IFS='|' read -r name shape tenv; do
    [ -z "$name" ] && continue
    [ "$(limit 30 5)" -lt 20 ] && break
    read -r -a tenv_a <<<"${tenv:-}"
    env "${tenv_a[@]}" QSDPA_TRACE_FILE="$out/trace_$name.jsonl" QSDPA_TRACE_SKIP=14 QSDPA_TRACE_CALLS=3 \
      timeout "$(limit 30 5)" "$tcli" bench --backend cuda --no-torch $shape --iters 20 >>"$out/trace.log" 2>&1
    python3 scripts/trace_summary.py "$out/trace_$name.jsonl" "$name ($shape${tenv:+; $tenv})" >>"$out/trace.txt" 2>&1
  done <<<"${QSDPA_GPU_TRACE_SHAPES:-b8|--B 8 --N 32768 --bits 4
b8q8|--B 8 --N 32768 --bits 8
b1n131k|--B 1 --N 131072 --bits 4
b32n4k|--B 32 --N 4096 --bits 4
b1n4k|--B 1 --N 4096 --bits 4
d512|--B 4 --Hq 16 --Hkv 1 --D 512 --N 32768 --bits 4
lq4|--B 8 --N 32768 --Lq 4 --bits 4}"
  say "traces: $(($(elapsed) - t0)) s"
  sed 's/^/  /' "$out/trace.txt" >>"$summary"
  (cd "$out" && ls trace_*.jsonl 2>/dev/null | xargs -r tar czf traces.tgz --remove-files)
fi

say "total: $(elapsed) s"
# At most 8 files come back from the GPU machine: the logs travel as one archive.
if [ "${QSDPA_GPU_PACK:-1}" = 1 ]; then
  (cd "$out" && for f in build.log ctest.log sanitizer.log bench.log nvidia-smi.txt serving.log tune.log \
    ncu_source.log ncu_source*.csv trace.log; do
    [ -f "$f" ] && echo "$f"; done | xargs -r tar czf logs.tgz --remove-files)
fi
exit 0  # (what ran and how it ended is in summary.txt)
