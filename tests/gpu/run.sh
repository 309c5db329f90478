#!/usr/bin/env bash
# The GPU script for the lent device machine (CUDA 13, cmake; no Criterion,
# libuv or SWIG there).  Builds with CUDA and without the Criterion suites,
# runs the CUDA checks, and writes logs and results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
{
  date -u
  nvidia-smi || true
  cmake -S . -B build/gpu -DPSTAR_WITH_CUDA=ON -DPSTAR_CRITERION=OFF -DPSTAR_BUILD_EXAMPLES=ON
  cmake --build build/gpu -j "$(nproc)"
  (cd build/gpu && ctest -L cuda --output-on-failure)
} 2>&1 | tee "$out/gpu-run.log"
