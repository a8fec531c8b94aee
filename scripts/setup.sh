#!/usr/bin/env bash
# One command on a fresh machine: install what is missing, build (with the CUDA backend wherever
# nvcc exists), and run the main job: `qsdpa run` on its default decode workload.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSDPA_CUDA=AUTO
cmake --build "$BUILD" -j"$(nproc)"
"$BUILD"/tools/qsdpa run "$@"
