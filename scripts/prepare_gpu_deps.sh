#!/usr/bin/env bash
# Copies the dependencies that the GPU machine lacks (it has no apt and no network; it does have
# cmake, ninja, nvcc and python3) into .deps/ of the repository (git-ignored), for a build there
# with -DQSDPA_DEPS_DIR=$PWD/.deps:
#   .deps/googletest         GoogleTest sources (Debian's libgtest-dev, /usr/src/googletest)
#   .deps/include/CLI        CLI11 headers (libcli11-dev)
#   .deps/include/nlohmann   nlohmann/json headers (nlohmann-json3-dev)
# Run it here, on the development machine, before a device run; scripts/gpu_run.sh uses the copy.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$root/.deps"

need() {
  if [ ! -e "$1" ]; then
    echo "prepare_gpu_deps: $1 is missing: install $2 (apt-get install $2)" >&2
    exit 1
  fi
}
need /usr/src/googletest/CMakeLists.txt libgtest-dev
need /usr/include/CLI/CLI.hpp libcli11-dev
need /usr/include/nlohmann/json.hpp nlohmann-json3-dev
need /usr/include/hwy/highway.h libhwy-dev

rm -rf "$deps/googletest" "$deps/include/CLI" "$deps/include/nlohmann" "$deps/include/hwy" "$deps/lib"
mkdir -p "$deps/include" "$deps/lib"
cp -r /usr/src/googletest "$deps/googletest"
cp -r /usr/include/CLI "$deps/include/CLI"
cp -r /usr/include/nlohmann "$deps/include/nlohmann"
cp -r /usr/include/hwy "$deps/include/hwy"
cp -L "$(ls /usr/lib/*/libhwy.so.1 | head -1)" "$deps/lib/libhwy.so.1"
echo "prepare_gpu_deps: $(du -sh "$deps" | cut -f1) in $deps"
