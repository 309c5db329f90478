#!/usr/bin/env bash
# The GPU script for the lent device machine (one H200; CUDA 13 and cmake, no
# Criterion, libuv, SWIG, CLI11 or package registry there).  Builds the
# library with CUDA and without the Criterion suites, then runs the CUDA
# checks: the Adam kernel bit-for-bit against the CPU path, its fraction of
# HBM bandwidth, the tier's pinned copies against cudaMemcpy, and a training
# run on the CUDA device against the emulated device.  Writes logs and JSON
# results to the folder given as its argument (default $OUT, else gpu-out).
# Tried on a machine without a GPU, every check reports itself skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-$PWD/gpu-out}}
mkdir -p "$out"
build=build/gpu
status=0
{
  date -u
  nvidia-smi || echo "nvidia-smi: not available"
  cmake -S . -B "$build" -DPSTAR_WITH_CUDA=ON -DPSTAR_CRITERION=OFF -DCMAKE_BUILD_TYPE=Release || exit 1
  cmake --build "$build" -j "$(nproc)" --target cuda_engine_check adam_cuda_check || exit 1
  if [ -f "$build/CMakeCache.txt" ] && grep -q "^PSTAR_NCCL_LIBRARY:FILEPATH=/" "$build/CMakeCache.txt"; then
    cmake --build "$build" -j "$(nproc)" --target nccl_check || exit 1
  fi
  echo "==> adam_cuda_check"
  "$build/bin/adam_cuda_check" "$out"; rc=$?
  [ $rc = 77 ] && echo "adam_cuda_check: skipped (no CUDA device)"
  [ $rc != 0 ] && [ $rc != 77 ] && status=1
  echo "==> cuda_engine_check"
  "$build/bin/cuda_engine_check"; rc=$?
  [ $rc = 77 ] && echo "cuda_engine_check: skipped (no CUDA device)"
  [ $rc != 0 ] && [ $rc != 77 ] && status=1
  if [ -x "$build/bin/nccl_check" ]; then
    echo "==> nccl_check"
    "$build/bin/nccl_check"; rc=$?
    [ $rc = 77 ] && echo "nccl_check: skipped (no CUDA device)"
    [ $rc != 0 ] && [ $rc != 77 ] && status=1
  else
    echo "nccl_check: not built (no NCCL)"
  fi
  echo "gpu run.sh: exit status $status"
  exit $status
} 2>&1 | tee "$out/gpu-run.log"
exit "${PIPESTATUS[0]}"
