#!/usr/bin/env bash
# Do the GPU tests of the in-kernel merge (and of the launches as programmatic dependents) fail
# when its code is wrong? Run on the GPU machine after
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
all_tests="test_cuda_runtime@$tests_rt test_cuda_serving@$tests_sv test_cuda_attention@$tests_at"
tests_pool='test_cuda_attention@CudaAttention.TilePoolBlocks test_cuda_serving@CudaServingPool.*'
tests_arr='test_cuda_serving@Cases/CudaServingMmaArrivals.* test_cuda_attention@CudaAttention.WideRowsManySplitsInKernelMerge test_cuda_runtime@CudaRuntime.ChainedCallsWaitForTheirInputs'
tests_vf='test_cuda_attention@CudaAttention.ValueScalesOfEveryMagnitude:CudaAttention.HeadDim512OnTensorCores:CudaAttention.NearZeroValuesOfWideGroups'
tests_vp='test_cuda_attention@CudaAttention.FewRowsPerKvHeadInOneNTile:CudaAttention.ValueScalesOfEveryMagnitude:CudaAttention.TilePoolBlocks:CudaAttention.NearZeroValuesOfWideGroups'

# name|file|sed expression|what it breaks|tests (program@filter, space-separated)|scope
# (no '|' inside a field: '..' stands for '||' in a pattern, and `or` in C++ replaces it)
# scope "all" rebuilds every object the change touches; "g64" rebuilds only the instantiations
# with the group size 64 as a constant (src/cuda/g64/, which run every f16 / bf16 group-64 case on
# sm_90a) and takes the other objects as they are: a few minutes less, and the tests of other
# formats run the unchanged code.
mutants=(
  'no-reset|src/cuda/mma_kernel.cuh|s/^    if (before == S - 1) a.counters\[blockIdx.x\] = 0;.*$//|the last split no longer sets its row tile'"'"'s counter back to 0|'"$all_tests"'|all'
  'no-reset-g64|src/cuda/mma_kernel.cuh|s/^    if (before == S - 1) a.counters\[blockIdx.x\] = 0;.*$//|the same, in the group-64 instantiations only|test_cuda_runtime@'"$tests_rt"'|g64'
  'empty-silent|src/cuda/mma_kernel.cuh|s/^        merge_if_last_cold<kRT, W>(&a, reinterpret_cast<float\*>(smem), nrows, r0, b, kvh, rep, Lq);$/        ;/|a split without tokens no longer counts its arrival|'"$all_tests"'|all'
  'batch-drop-split|src/cuda/mma_kernel.cuh|s/wb\[e\]\[k\] = live \&\& k < S ? wm/wb[e][k] = live \&\& k + 1 < S ? wm/|the batch merge (two-n-tile kernels) leaves the last split out of the sum|test_cuda_runtime@'"$tests_rt"' test_cuda_serving@'"$tests_sv"'|g64'
  'no-pdl-wait|src/cuda/mma_kernel.cuh|s/^  asm volatile("griddepcontrol.wait;\\n" ::: "memory");$//|the attention kernel, launched as a programmatic dependent, no longer waits for the previous kernel before it reads|test_cuda_runtime@CudaRuntime.ChainedCallsWaitForTheirInputs|g64'
  'pool-twice|src/cuda/mma_kernel.cuh|s/^    if (tid == 0) \*pool = W;/    if (tid == 0) *pool = W - 1;/|the tile pool hands out tile W - 1 twice (one tile counted twice)|'"$tests_pool"'|g64'
  'pool-skip|src/cuda/mma_kernel.cuh|s/^    if (tid == 0) \*pool = W;/    if (tid == 0) *pool = W + 1;/|the tile pool never hands out tile W (one tile lost)|'"$tests_pool"'|g64'
  'pair-never|src/cuda/backend.cu|s/return units <= 2 \* sms \&\& fills(2 \* sms) ? 2 : 0;/return 0;/|the planner never takes the tile pool'"'"'s blocks of 8 warps (B=32 N=4096 back on 4-warp blocks)|test_cuda_attention@CudaAttention.TilePoolBlocks test_cuda_dispatch@CudaDispatch.TilePoolDefaultsOnTheBenchShapes|all'
  'vfold-no-exp|src/cuda/mma_kernel.cuh|s/^  if (!(__any_sync(0xffffffffu, big) .. __all_sync(0xffffffffu, small))) return false;$/  if (true) return false;/|the folded values'"'"' exponent never moves (p s leaves f16'"'"'s range for large or tiny scales)|'"$tests_vf"'|g64'
  'vfold-no-bias|src/cuda/mma_kernel.cuh|s/^          Y::mma(zacc, A, zb0, zb1);$//|the folded values lose their biases (Σ p z)|'"$tests_vf"'|g64'
  'vfold-no-lo|src/cuda/mma_kernel.cuh|s/^                  Y::mma(o\[dt\]\[nt\], A, pl\[nt\]\[0\], pl\[nt\]\[1\]);$//|the folded weights p s keep their f16 rounding (hi only, no lo)|'"$tests_vf"'|g64'
  'vpack-no-mirror|src/cuda/mma_kernel.cuh|s/^          for (int e = 0; e < 4; ++e) y\[mt\]\[0\]\[e\] = __shfl_sync(0xffffffffu, y\[mt\]\[0\]\[e\], src);$/          ;/|kVPack: columns 4-7 keep the padding rows'"'"' logits, so their lo halves weigh the wrong rows|'"$tests_vp"'|g64'
  'vpack-hi-twice|src/cuda/mma_kernel.cuh|s/ph\[nt\]\[0\] = YF::mul2_part(pt\[mt\]\[nt\]\[0\], s01, lo_lane);/ph[nt][0] = YF::mul2_part(pt[mt][nt][0], s01, false);/|kVPack: columns 4-7 carry the hi halves again (for the first 8 tokens of each 16), not the lo ones|'"$tests_vp"'|g64'
  'vpack-no-fold-in|src/cuda/mma_kernel.cuh|s/^          for (int e = 0; e < 4; ++e) o\[dt\]\[0\]\[e\] += __shfl_xor_sync(0xffffffffu, o\[dt\]\[0\]\[e\], 2);$/          ;/|kVPack: the lo columns are never added to the hi ones (p s at f16 precision)|'"$tests_vp"'|g64'
  'direct-no-sink|src/cuda/mma_kernel.cuh|s/^          wgt = f2 \/ den;$/          wgt = 1.0f \/ l;/|a grid of one split writes its output without the row'"'"'s sink|test_cuda_attention@CudaAttention.OneSplitWritesTheOutput:CudaAttention.NoKeysGivesZeros|g64'
  'direct-empty-silent|src/cuda/mma_kernel.cuh|s/^        store_t(a.out, a.dtype, a.omap.at(b, kvh \* rep + hl, i) + d, 0.0f);$//|a grid of one split leaves the rows of an empty sequence unwritten|test_cuda_attention@CudaAttention.OneSplitWritesTheOutput:CudaAttention.NoKeysGivesZeros|g64'
  'compact-no-sink|src/cuda/mma_kernel.cuh|s/^    if (m_all != -INFINITY \&\& a.sinks) denom += expf(sink - mx);$//|the compact merge of the two-n-tile kernels leaves the row'"'"'s sink out|test_cuda_attention@CudaAttention.TwoNTileInKernelMerge|g64'
  'compact-one-row|src/cuda/mma_kernel.cuh|s/^    if constexpr (kCompact) rpos\[lr\] = int64_t(split) \* rows_total + qrow_of(lr);/    if constexpr (kCompact) rpos[lr] = int64_t(split) * rows_total + qrow_of(lr \/ 2);/|the compact epilogue stores two rows'"'"' partials in one row|test_cuda_attention@CudaAttention.TwoNTileInKernelMerge|g64'
  'q-unaligned-swap|src/cuda/mma_kernel.cuh|s/e\[j\] = __ldg(src + j);/e[j] = __ldg(src + (j ^ 1));/|the query rows'"'"' element-by-element fallback (a 16-byte piece that is not 16-byte aligned) swaps neighbouring elements|test_cuda_attention@CudaAttention.QueryRowsAtAnyAlignment|g64'
  'arrivals-no-wait|src/cuda/combine.cu|s/^        wait_count(a.arrivals + tile, S);$//|with counted arrivals, the combine kernel'"'"'s rows no longer wait for their row tile'"'"'s splits|'"$tests_arr"'|all'
  'arrivals-no-reset|src/cuda/combine.cu|s/^    if (a.arrivals \&\& threadIdx.x == 0 \&\& readers == tile_n - 1) a.arrivals\[tile\] = 0;$//|with counted arrivals, the combine kernel no longer sets the row tiles'"'"' counts back to 0|'"$tests_arr"'|all'
  'oneround-sv-short|src/cuda/combine.cu|s/^      sv = splits_with_tokens(\(.*\), S);$/      sv = splits_with_tokens(\1, S) - 1;/|with QSDPA_COMBINE_ONE_ROUND=1 (a build with it: the mutant changes nothing otherwise), the combine kernel takes the last split that holds a token of a shorter sequence as empty and reads the one before in its place|test_cuda_serving@Cases/CudaServingMmaCombine.*|all'
  'epi-no-swap2|src/cuda/mma_kernel.cuh|s/^      if (sw \& 2) acc = .*$//|the epilogue'"'"'s four-dim reads no longer undo bit 1 of the swizzle'"'"'s flip (dims of a row swapped in pairs of two)|test_cuda_attention@CudaAttention.LongCacheManySplits:CudaAttention.OneSplitWritesTheOutput:CudaAttention.TwoNTileInKernelMerge|g64'
  'merge-first-round|src/cuda/mma_kernel.cuh|s/^      for (int s0 = 0; s0 < S; s0 += 8) {$/      for (int s0 = 0; s0 < S \&\& s0 < 8; s0 += 8) {/|the in-kernel merge of the one-n-tile kernels sums only the first 8 of more splits|test_cuda_attention@CudaAttention.WideRowsManySplitsInKernelMerge:CudaAttention.LongCacheManySplits|g64'
  'compact-first-round|src/cuda/mma_kernel.cuh|s/^    for (int s0 = 0; s0 < S; s0 += 8) {$/    for (int s0 = 0; s0 < S \&\& s0 < 8; s0 += 8) {/|the compact in-kernel merge (two-n-tile and D = 512 kernels) sums only the first 8 of more splits|test_cuda_attention@CudaAttention.WideRowsManySplitsInKernelMerge:CudaAttention.TwoNTileInKernelMerge|g64'
  'slices-no-offset|src/cuda/combine.cu|s/^    const int d0 = (int(slot) \& ((1 << lc) - 1)) \* DS + dt;.*$/    const int d0 = dt;/|the combine kernel in head-dim slices (D = 512, and 256 with QSDPA_COMBINE_SLICES=2; few rows of many splits) merges every slice from the row'"'"'s first head dims|test_cuda_attention@CudaAttention.WideRowsManySplitsInKernelMerge test_cuda_serving@Cases/CudaServingMmaCombine.*|all'
  'combine-ml-half|src/cuda/combine.cu|s/^      if (threadIdx.x < 64) {$/      if (threadIdx.x < 32) {/|the combine kernel'"'"'s blocks of groups load the (m, l) of splits 0-31 only (splits 32-63 read as never written: -inf, 0)|test_cuda_attention@CudaAttention.WideRowsManySplitsInKernelMerge:CudaAttention.HeadDim512OnTensorCores test_cuda_serving@Cases/CudaServingMmaCombine.*|all'
  'dsplit-scale-first|src/cuda/mma_kernel.cuh|s/cp_async_small<kSB>(sd + uint32_t(8 \* j \* kSB), ps + 8 \* j \* (D \/ GC) \* 2, true);/cp_async_small<kSB>(sd + uint32_t(8 * j * kSB), ps, true);/|the d-split'"'"'s full tiles copy the scales of the lane'"'"'s first token for all 4 of its tokens|test_cuda_attention@CudaAttention.HeadDim512OnTensorCores:CudaAttention.WideRowsManySplitsInKernelMerge test_cuda_serving@CudaServingWide.*|g64'
  'dsplit-partial-short|src/cuda/mma_kernel.cuh|s/^          const bool in = sc_lane_k + 8 \* j < lf;$/          const bool in = sc_lane_k + 8 * j < lf - 1;/|the d-split'"'"'s last, partial tile zero-fills the scales of its last token|test_cuda_attention@CudaAttention.HeadDim512OnTensorCores:CudaAttention.WideRowsManySplitsInKernelMerge test_cuda_serving@CudaServingWide.*|g64'
  'rowsm-seven-warps|src/cuda/mma_rowsm.cuh|s/for (int w2 = 0; w2 < W; ++w2) {  \/\/ (the same order/for (int w2 = 0; w2 < W - 1; ++w2) {  \/\/ (the same order/|the rows-on-M D = 512 kernel'"'"'s row owners sum the partial logits of 7 of the 8 warps (the last 64 head dims dropped)|test_cuda_attention@CudaAttention.HeadDim512RowsOnM|g64'
  'rowsm-pipe-slot|src/cuda/mma_rowsm.cuh|s/      step_values(sv, xo);/      step_values(sa, xo);/|the rows-on-M kernel'"'"'s pipelined loop (4-bit) takes the values of the tile whose keys it just used (ring slot of tile it + 1, not it)|test_cuda_attention@CudaAttention.HeadDim512RowsOnM|g64'
  'pool-2bit-as-4|src/cuda/mma_dispatch_impl.cuh|s/if (a.k_bits == 2) return d.template operator()<T, 2, 2>();/if (a.k_bits == 2) return d.template operator()<T, 4, 4>();/|the tile pool runs 2-bit caches on its 4-bit kernels|'"$tests_pool"'|g64'
  'pool-2bit-all-sizes|src/cuda/backend.cu|s/units \* kPool2BitSmsPerRowTile < sms/units * kPool2BitSmsPerRowTile < 0/|the planner takes the 2-bit pool for any number of row tiles (B=1 N=131072 too)|test_cuda_attention@CudaAttention.TilePoolBlocks test_cuda_dispatch@CudaDispatch.TilePoolDefaultsOnTheBenchShapes|all'
  'deterministic-ignored|src/cuda/backend.cu|s/if (mode == 0 .. a.deterministic .. !cuda::mma_pool_fits(a)) return 0;/if (mode == 0 or !cuda::mma_pool_fits(a)) return 0;/|the planner takes the tile pool for a deterministic call (AttentionParams::deterministic ignored)|test_cuda_attention@CudaAttention.DeterministicCallsRepeatTheirBits test_cuda_dispatch@CudaDispatch.DeterministicCallsNeverTakeTheTilePool|all'
  'zeroed-unasked|src/cuda/backend.cu|s/return in_kernel_merge(a, !p.workspace .. p.workspace_zeroed);/return in_kernel_merge(a, true);/|a caller'"'"'s workspace is taken as zero-filled without workspace_zeroed|test_cuda_runtime@'"$tests_rt"' test_cuda_dispatch@CudaDispatch.InKernelMergeOnlyWithAZeroedWorkspace|all'
)
# QSDPA_MUTANTS='name name': only these (default: all)
only=" ${QSDPA_MUTANTS:-} "

# Every file a mutant plants its bug in (the table's second field) is saved first and put back
# before each mutant. (Until 2026-12-06 the list was written out by hand and lacked mma_rowsm.cuh:
# in run 96 the mutant rowsm-seven-warps stayed in that file while rowsm-pipe-slot ran.)
mfiles=()
for m in "${mutants[@]}"; do
  IFS='|' read -r _ mf _ <<<"$m"
  [[ " ${mfiles[*]} " == *" $mf "* ]] || mfiles+=("$mf")
done
restore() { for f in "${mfiles[@]}"; do [ -f "$out/orig.$(basename "$f")" ] && cp "$out/orig.$(basename "$f")" "$f"; done; }
# On every way out: the source restored, and the objects built from mutated source deleted. The
# restored source is newer than them here, but the device machine's next copy of the tree may
# carry the files with older times, and a build then took the mutant's objects as up to date
# (2026-12-04, run 80: its suite ran on the last mutant's merge). The next build recompiles the
# library.
finish() {
  restore
  find "$build/src" -name '*.o' -delete
}
trap finish EXIT
for f in "${mfiles[@]}"; do cp "$f" "$out/orig.$(basename "$f")"; done

for m in "${mutants[@]}"; do
  IFS='|' read -r name file expr what tests scope <<<"$m"
  [ "$only" != "  " ] && [[ "$only" != *" $name "* ]] && continue
  left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 100 ]; then say "mutant $name: not run ($left s of the budget left)"; continue; fi
  # (the vpack- mutants break code that only a build with -DQSDPA_MMA_VPACK=1 has: scripts/gpu_run.sh
  # with QSDPA_GPU_CUDA_FLAGS=-DQSDPA_MMA_VPACK=1 before this script)
  if [[ "$name" == vpack-* ]] && ! grep -q '^CMAKE_CUDA_FLAGS:.*-DQSDPA_MMA_VPACK=1' "$build/CMakeCache.txt" 2>/dev/null; then
    say "mutant $name: not run (the build has no -DQSDPA_MMA_VPACK=1)"
    continue
  fi
  restore
  sed -i "$expr" "$file"
  if cmp -s "$file" "$out/orig.$(basename "$file")"; then say "mutant $name: the sed changed nothing (script out of date)"; continue; fi
  { echo "===== mutant $name: $what"; diff "$out/orig.$(basename "$file")" "$file"; } >>"$log"
  t0=$(date +%s)
  progs=()
  for pair in $tests; do progs+=("${pair%%@*}"); done
  if [ "$scope" = g64 ]; then
    objs=$(ninja -C "$build" -t targets all 2>/dev/null | grep -o '^src/CMakeFiles/qsdpa_g64_obj.dir/[^:]*\.o' | sort -u)
    # shellcheck disable=SC2086
    timeout $((left - 60)) ninja -C "$build" $objs >>"$log" 2>&1
    find "$build/src/CMakeFiles/qsdpa_obj.dir" -name '*.o' -exec touch {} +  # (taken as they are)
  fi
  timeout $((left - 60)) cmake --build "$build" -j"$(nproc)" --target "${progs[@]}" >>"$log" 2>&1
  brc=$?
  if [ $brc -ne 0 ]; then say "mutant $name: build failed (rc $brc)"; continue; fi
  failed=0 passed=0 names="" crashed=0
  for pair in $tests; do
    bin="${pair%%@*}" filt="${pair#*@}"
    left=$((budget - ($(date +%s) - start)))
    txt=$(timeout $((left > 40 ? left - 20 : 20)) "$build/tests/$bin" --gtest_filter="$filt" 2>&1)
    prc=$?
    echo "$txt" >>"$log"
    f=$(echo "$txt" | grep '^\[  FAILED  \] [A-Za-z]' | sed 's/ (.*//' | sort -u | wc -l)
    p=$(echo "$txt" | grep -c '^\[       OK \]')
    failed=$((failed + f)) passed=$((passed + p))
    names="$names $(echo "$txt" | grep '^\[  FAILED  \] [A-Za-z]' | sed 's/^\[  FAILED  \] //; s/ .*//' | sort -u | tr '\n' ' ')"
    if ! echo "$txt" | grep -q '^\[  PASSED  \]\|^\[  FAILED  \] [0-9]* test'; then
      if [ "$prc" -eq 124 ]; then
        # (assertions that failed before the cut-off still count: run 104's pool-2bit-as-4 had
        # failed 9 cases of TilePoolBlocks when the budget stopped its program)
        # (of the test that was running: those of finished tests are in f already)
        cf=$(echo "$txt" | awk '/^\[ RUN      \]/ { n = 0 } /: Failure$/ { n++ } END { print n + 0 }')
        names="$names (${bin}: cut off by the budget after $cf failed assertions)"
        failed=$((failed + cf))
      else  # (crashed, e.g. on an illegal address: the mutant was caught)
        names="$names (${bin}: crashed, rc $prc)" crashed=$((crashed + 1))
      fi
    fi
  done
  verdict=KILLED
  [ "$failed" -eq 0 ] && [ "$crashed" -eq 0 ] && verdict=SURVIVED
  say "mutant $name ($what): $verdict: $failed tests failed, $passed passed ($(($(date +%s) - t0)) s, build and tests)"
  say "  failed:$names"
done
finish
trap - EXIT
say "restored; total $(($(date +%s) - start)) s"
rm -f "$out"/orig.*
