#!/usr/bin/env bash
# Installs what the build and the tests need and is missing: Debian packages (compiler, CMake,
# Ninja, GoogleTest, Google Benchmark, CLI11, nlohmann/json, Highway) and, from PyPI, NumPy and MLX
# (the oracle of the quantizer test). Safe to run again: it installs only what is absent.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install_deps: not root and no sudo; install the packages listed in scripts/install_deps.sh by hand" >&2
  fi
fi

pkgs=(cmake ninja-build g++ python3 python3-pip python3-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcli11-dev nlohmann-json3-dev libhwy-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# A cross compiler for aarch64, so that the tests also compile the CPU SIMD kernel for Arm (NEON).
# Optional: where the package cannot be had, that test is not registered.
if ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 && [ -z "${QSDPA_NO_ARM_CHECK:-}" ]; then
  echo "install_deps: apt-get install g++-aarch64-linux-gnu (the Arm compile check)"
  $SUDO apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu ||
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu; } ||
    echo "install_deps: g++-aarch64-linux-gnu not available; the Arm compile check is skipped" >&2
fi

PY=${PYTHON:-python3}
# numpy + mlx: the oracles of the Python tests; nanobind: the Python extension; pytest; ml_dtypes
# (bfloat16 arrays in NumPy).
if ! "$PY" -c "import numpy, mlx.core, nanobind, pytest, ml_dtypes" >/dev/null 2>&1; then
  echo "install_deps: pip install numpy mlx mlx-cpu nanobind pytest ml_dtypes"
  "$PY" -m pip install -q numpy mlx mlx-cpu nanobind pytest ml_dtypes 2>/dev/null \
    || "$PY" -m pip install -q --break-system-packages numpy mlx mlx-cpu nanobind pytest ml_dtypes
fi
