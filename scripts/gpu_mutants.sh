#!/usr/bin/env bash
# Do the GPU tests of the in-kernel merge fail when its code is wrong? Run on the GPU machine after
# scripts/gpu_run.sh (it reuses that build folder): for each mutant below, plant the bug in the
# source, rebuild the CUDA test programs, run the tests meant to catch it, and put the source back.
# Every mutant must make at least one of its tests fail; a mutant that all pass is reported as
# SURVIVED. Usage:
#
#   scripts/gpu_mutants.sh OUTDIR        (mutants.txt, mutants.log; QSDPA_GPU_BUILD, QSDPA_MUTANT_BUDGET)
set -uo pipefail
out="${1:?usage: scripts/gpu_mutants.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${QSDPA_GPU_BUILD:-build-gpu}"
budget="${QSDPA_MUTANT_BUDGET:-560}"
start=$(date +%s)
res="$out/mutants.txt" log="$out/mutants.log"
: >"$res"
: >"$log"
say() { echo "$*" | tee -a "$res"; }

if [ ! -f "$build/CMakeCache.txt" ]; then
  deps_flag=()
  [ -d "$root/.deps" ] && deps_flag=(-DQSDPA_DEPS_DIR="$root/.deps")
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSDPA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a-real -DQSDPA_TEST_MLX=OFF "${deps_flag[@]}" >>"$log" 2>&1
fi

tests_rt='CudaRuntime.InKernelMergeAcrossCalls:CudaRuntime.ZeroedCallerWorkspaceAndGraphReplays'
tests_sv='Cases/CudaServingMmaInKernel.*:CudaServingInKernel.*'
tests_at='CudaAttention.LongCacheManySplits:CudaSanitize.*'

# name|file|sed expression|what it breaks
mutants=(
  'no-reset|src/cuda/mma_kernel.cuh|s/^    if (before == S - 1) a.counters\[blockIdx.x\] = 0;.*$//|the last split no longer sets its row tile'"'"'s counter back to 0'
  'empty-silent|src/cuda/mma_kernel.cuh|s/^        merge_if_last_cold<kRT>(&a, reinterpret_cast<float\*>(smem), nrows, r0, b, kvh, rep, Lq);$/        ;/|a split without tokens no longer counts its arrival'
  'zeroed-unasked|src/cuda/backend.cu|s/return in_kernel_merge(a, !p.workspace || p.workspace_zeroed);/return in_kernel_merge(a, true);/|a caller'"'"'s workspace is taken as zero-filled without workspace_zeroed'
)

restore() { for f in src/cuda/mma_kernel.cuh src/cuda/backend.cu; do [ -f "$out/orig.$(basename $f)" ] && cp "$out/orig.$(basename $f)" "$f"; done; }
trap restore EXIT
cp src/cuda/mma_kernel.cuh "$out/orig.mma_kernel.cuh"
cp src/cuda/backend.cu "$out/orig.backend.cu"

for m in "${mutants[@]}"; do
  IFS='|' read -r name file expr what <<<"$m"
  left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 150 ]; then say "mutant $name: not run ($left s of the budget left)"; continue; fi
  restore
  sed -i "$expr" "$file"
  if cmp -s "$file" "$out/orig.$(basename "$file")"; then say "mutant $name: the sed changed nothing (script out of date)"; continue; fi
  { echo "===== mutant $name: $what"; diff "$out/orig.$(basename "$file")" "$file"; } >>"$log"
  t0=$(date +%s)
  timeout $((left - 60)) cmake --build "$build" -j"$(nproc)" --target test_cuda_attention test_cuda_runtime test_cuda_serving \
    >>"$log" 2>&1
  brc=$?
  if [ $brc -ne 0 ]; then say "mutant $name: build failed (rc $brc)"; continue; fi
  failed=0 passed=0 names=""
  for pair in "test_cuda_runtime|$tests_rt" "test_cuda_serving|$tests_sv" "test_cuda_attention|$tests_at"; do
    bin="${pair%%|*}" filt="${pair#*|}"
    txt=$(timeout 120 "$build/tests/$bin" --gtest_filter="$filt" 2>&1)
    echo "$txt" >>"$log"
    f=$(echo "$txt" | grep -c '^\[  FAILED  \] [A-Za-z]')
    p=$(echo "$txt" | grep -c '^\[       OK \]')
    failed=$((failed + f)) passed=$((passed + p))
    names="$names $(echo "$txt" | grep '^\[  FAILED  \] [A-Za-z]' | sed 's/^\[  FAILED  \] //; s/ .*//' | sort -u | tr '\n' ' ')"
  done
  verdict=KILLED
  [ "$failed" -eq 0 ] && verdict=SURVIVED
  say "mutant $name ($what): $verdict: $failed failed, $passed passed (build $(($(date +%s) - t0)) s incl. tests)"
  say "  failed:$names"
done
restore
trap - EXIT
# the build folder holds the mutants' objects now: rebuild it from the restored source
left=$((budget - ($(date +%s) - start)))
[ "$left" -gt 30 ] && timeout $((left - 10)) cmake --build "$build" -j"$(nproc)" --target test_cuda_attention \
  test_cuda_runtime test_cuda_serving >>"$log" 2>&1
say "restored; rebuild rc $? ; total $(($(date +%s) - start)) s"
rm -f "$out"/orig.*
