#!/usr/bin/env bash
# Failure demonstration for the 2-bit tensor-core path, run on the GPU machine from the repository
# root: copies the tree, plants two bugs in src/cuda/mma_format.cuh (a wrong B-side factor for the
# second 2-bit field of f16 keys; bf16 values of fields 4..7 read from the wrong half-word), builds
# test_cuda_attention and runs CudaAttention.TwoBitOnTensorCores, which must fail. Usage:
#   scripts/mutation_2bit.sh OUTDIR      (mutation.diff, mutation.txt, mutation_build.log)
set -u
out="${1:?usage: scripts/mutation_2bit.sh OUTDIR}"; mkdir -p "$out"; root="$(cd "$(dirname "$0")/.." && pwd)"; cd "$root"
rm -rf /tmp/mut && mkdir /tmp/mut
tar --exclude=./build-gpu --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/mut
cd /tmp/mut
sed -i 's/(d \& 3) == 1 ? 0.25f/(d \& 3) == 1 ? 0.5f/' src/cuda/mma_format.cuh
sed -i 's/u\[k + 4\] = Y::fma2(Y::add2(and_or(y >> (2 \* k), 0x00030003u, 0x43004300u)/u[k + 4] = Y::fma2(Y::add2(and_or(x >> (2 * k), 0x00030003u, 0x43004300u)/' src/cuda/mma_format.cuh
git diff --no-index "$root/src/cuda/mma_format.cuh" src/cuda/mma_format.cuh > "$out/mutation.diff"
cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSDPA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DQSDPA_TEST_MLX=OFF -DQSDPA_DEPS_DIR="$root/.deps" -DQSDPA_PYTHON=OFF > "$out/mutation_build.log" 2>&1 &&
  timeout 200 cmake --build b -j"$(nproc)" --target test_cuda_attention >> "$out/mutation_build.log" 2>&1
echo "build rc $?" > "$out/mutation.txt"
timeout 120 ./b/tests/test_cuda_attention --gtest_filter='CudaAttention.TwoBitOnTensorCores' >> "$out/mutation.txt" 2>&1
echo "test rc $?" >> "$out/mutation.txt"
