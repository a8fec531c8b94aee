#!/usr/bin/env bash
# On the GPU machine: per-kernel durations (ncu serializes the kernels, so each is timed alone) and
# the combine kernel's profile (speed of light, warp states, memory, source counters) on the D=512
# and D=256 bench shapes, 4-bit. Builds the qsdpa program alone in build-gpu (unless
# scripts/gpu_run.sh built it there). Output in $OUT:
# ncu_dur_NAME.txt, ncu_combine_NAME.txt, ncu_combine_src_NAME.csv. Usage (from the repository
# root): OUT=DIR bash scripts/gpu_ncu_combine.sh
set -u
OUT="${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
[ -x build-gpu/tools/qsdpa ] || cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSDPA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real -DQSDPA_TEST_MLX=OFF -DQSDPA_DEPS_DIR=$PWD/.deps > $OUT/cfg.log 2>&1
[ -x build-gpu/tools/qsdpa ] || ( time cmake --build build-gpu -j16 --target qsdpa ) > $OUT/build.log 2>&1; echo "build rc $?"
cli=build-gpu/tools/qsdpa
for s in "d512|--B 4 --Hq 16 --Hkv 1 --D 512 --N 32768 --bits 4" "d256|--B 4 --Hq 16 --Hkv 2 --D 256 --N 32768 --bits 4"; do
  name=${s%%|*}; sh=${s#*|}
  timeout 60 ncu --clock-control none -k regex:'attention_kernel|combine_kernel' --launch-skip 20 --launch-count 4 --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread $cli bench --backend cuda --no-torch $sh --iters 20 > $OUT/ncu_dur_$name.txt 2>&1
  timeout 60 ncu --clock-control none -k regex:combine_kernel --launch-skip 12 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis $cli bench --backend cuda --no-torch $sh --iters 5 > $OUT/ncu_combine_$name.txt 2>&1
  timeout 60 ncu --clock-control none -k regex:combine_kernel --launch-skip 12 --launch-count 1 --section SourceCounters -f -o $OUT/src_$name $cli bench --backend cuda --no-torch $sh --iters 5 > /dev/null 2>&1 && ncu -i $OUT/src_$name.ncu-rep --page source --csv --print-source sass > $OUT/ncu_combine_src_$name.csv 2>&1; rm -f $OUT/src_$name.ncu-rep
  echo "$name done"
done
grep -E "combine_kernel|attention_kernel|gpu__time" $OUT/ncu_dur_d512.txt | head -12
grep -E "Duration|Throughput|Registers|Achieved Occupancy" $OUT/ncu_combine_d512.txt | head -12
