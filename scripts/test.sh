#!/usr/bin/env bash
# One command: install what is missing, build everything (the CUDA backend is compiled wherever
# nvcc exists; its GPU tests skip with a reason where there is no device) and run every test.
# With SANITIZE=1 it builds the CPU code with AddressSanitizer + UndefinedBehaviorSanitizer in
# build-asan and runs the C++ tests there too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD_DIR:-build}
PY=$(python3 -c 'import sys; print(sys.executable)')
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSDPA_CUDA=AUTO -DQSDPA_PYTHON=ON \
  -DPython_EXECUTABLE="$PY"
cmake --build "$BUILD" -j"$JOBS"
# C++ tests (GoogleTest), the MLX bit-exactness test and the Python package tests (pytest).
(cd "$BUILD" && ctest --output-on-failure -j"$JOBS")
if [ "${SANITIZE:-0}" = "1" ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQSDPA_CUDA=OFF -DQSDPA_SANITIZE=ON
  cmake --build build-asan -j"$JOBS"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j"$JOBS" -LE python)
fi
