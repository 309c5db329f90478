#!/usr/bin/env bash
# The GPU script for the lent device machine (one H200; CUDA 13, cmake, ninja
# and PyTorch, no Criterion, libuv, Gloo, SWIG or package registry there).
# Builds the library with CUDA and without the Criterion suites, then runs the
# CUDA checks: the Adam kernel bit-for-bit against the CPU path, its fraction
# of HBM bandwidth, the kernels of the bf16 and int8 state formats against
# the scalar reference and their bandwidth (also under memcheck), the tier's
# pinned copies against cudaMemcpy, a training run on the CUDA device against
# the emulated device, NCCL's loading at run time and the NCCL communicator on
# one rank, and PyTorch's fused AdamW on the same GPU as the kernel's baseline.
# Writes logs and JSON results to the folder given as its argument (default
# $OUT, else gpu-out).  Each check has its own time limit so that one hang
# cannot eat the machine's lease.  Tried on a machine without a GPU, every
# check reports itself skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-$PWD/gpu-out}}
mkdir -p "$out"
build=build/gpu
status=0
check_limit_s=${PSTAR_GPU_CHECK_LIMIT_S:-240}

# Runs one check: 0 passes, 77 is a visible skip, anything else fails.
run_check() {
  local name=$1
  shift
  echo "==> $name"
  local t0=$SECONDS
  timeout "$check_limit_s" "$@"
  local rc=$?
  case $rc in
    0) echo "$name: passed ($((SECONDS - t0)) s)" ;;
    77) echo "$name: skipped (no CUDA device)" ;;
    124) echo "$name: FAILED (over its ${check_limit_s} s limit)"; status=1 ;;
    *) echo "$name: FAILED (exit $rc)"; status=1 ;;
  esac
}

{
  date -u
  nvidia-smi || echo "nvidia-smi: not available"
  cmake_args=(-DPSTAR_WITH_CUDA=ON -DPSTAR_CRITERION=OFF -DCMAKE_BUILD_TYPE=Release)
  # nlohmann-json is not installed there: tests/gpu/prepare.sh copies its
  # header into build/gpu-deps here, and the run carries that folder.
  [ -f build/gpu-deps/include/nlohmann/json.hpp ] && cmake_args+=(-DPSTAR_JSON_INCLUDE="$PWD/build/gpu-deps/include")
  # Ninja where it exists, unless the build folder was made by another generator.
  command -v ninja >/dev/null && [ ! -f "$build/CMakeCache.txt" ] && cmake_args+=(-G Ninja)
  # NCCL: the toolkit's folders first (CMake looks there); else the copy that
  # PyTorch's wheels bring (nvidia-nccl-cu13), which has no unversioned .so.
  if ! ls /usr/local/cuda/lib*/libnccl.so* >/dev/null 2>&1; then
    nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
    if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
      lib=$(ls "$nccl_dir"/lib/libnccl.so* 2>/dev/null | head -n 1)
      [ -n "$lib" ] && cmake_args+=(-DPSTAR_NCCL_LIBRARY="$lib" -DPSTAR_NCCL_INCLUDE="$nccl_dir/include")
      echo "NCCL from PyTorch's wheel: $lib"
    fi
  fi
  t0=$SECONDS
  cmake -S . -B "$build" "${cmake_args[@]}" || exit 1
  targets=(cuda_engine_check adam_cuda_check adam_states_cuda_check cuda_engine_bench)
  grep -q "^PSTAR_NCCL_LIBRARY:FILEPATH=/" "$build/CMakeCache.txt" && targets+=(nccl_check nccl_engine_check nccl_loader_check pstar)
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" || exit 1
  echo "build: $((SECONDS - t0)) s"

  run_check adam_cuda_check "$build/bin/adam_cuda_check" "$out"
  run_check adam_states_cuda_check "$build/bin/adam_states_cuda_check" "$out"
  run_check cuda_engine_check "$build/bin/cuda_engine_check"
  if [ -x "$build/bin/nccl_check" ]; then
    # NCCL is dlopen'ed, not linked: from the wheel's folder (not on the
    # loader's path) it comes through the configured fallback.
    run_check nccl_not_linked sh tests/gpu/no_nccl_needed.sh "$build/lib/libpstar.so"
    run_check nccl_loader_check "$build/bin/nccl_loader_check"
    run_check nccl_check "$build/bin/nccl_check"
    run_check nccl_engine_check "$build/bin/nccl_engine_check"
  else
    echo "nccl_check: not built (no NCCL)"
  fi
  run_check cuda_engine_bench "$build/bin/cuda_engine_bench" "$out"
  if command -v compute-sanitizer >/dev/null; then
    run_check "cuda_engine_check under compute-sanitizer memcheck" \
      compute-sanitizer --tool memcheck --error-exitcode 1 "$build/bin/cuda_engine_check"
    run_check "adam_states_cuda_check --quick under compute-sanitizer memcheck" \
      compute-sanitizer --tool memcheck --error-exitcode 1 "$build/bin/adam_states_cuda_check" --quick "$out"
  else
    echo "compute-sanitizer: not available"
  fi
  run_check torch_adamw_bench python3 tests/gpu/torch_adamw_bench.py "$out"
  # The kernel against PyTorch's fused AdamW: same elements, same bytes.
  if [ -f "$out/adam_cuda.json" ] && [ -f "$out/torch_adamw.json" ]; then
    python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
ours = json.load(open(d + "/adam_cuda.json"))
torch = json.load(open(d + "/torch_adamw.json"))
print("adam step time, torch fused AdamW / libpstar kernel: %.3f (%.3f ms vs %.3f ms, %d elements)"
      % (torch["median_ms"] / ours["median_ms"], torch["median_ms"], ours["median_ms"], ours["elements"]))
PY
  fi
  # bench/e2e_train.py (issue 22): a transformers GPT-2 through pstar.torch
  # on the CUDA engine against plain PyTorch and FSDP2 offload, and the
  # planner's largest shape for this GPU and host trained for 3 steps.  It
  # needs the Python binding, which tests/gpu/prepare.sh copies from a build
  # with SWIG, and the libpstar built above with CUDA; skipped without them.
  e2e_py=build/gpu-deps/python
  if [ -f "$e2e_py/pstar/_capi.so" ] && [ -f "$build/lib/libpstar.so.0" ] &&
      LD_LIBRARY_PATH="$build/lib" PYTHONPATH="$e2e_py" python3 -c 'import pstar.torch' 2>"$out/e2e_import.log"; then
    [ -x "$build/bin/pstar-plan" ] || cmake --build "$build" -j "$(nproc)" --target pstar-plan >/dev/null
    check_limit_s=${PSTAR_GPU_E2E_LIMIT_S:-480} run_check e2e_train sh -c \
      'LD_LIBRARY_PATH="$1/lib" PYTHONPATH="$2" python3 bench/e2e_train.py --device cuda --checkpointing --json --plan "$1/bin/pstar-plan" > "$3/e2e_train.jsonl"' \
      e2e "$build" "$e2e_py" "$out"
    tail -n 1 "$out/e2e_train.jsonl" 2>/dev/null
  else
    echo "e2e_train: not run (no Python binding for this python3, or it does not load: $(tail -n 1 "$out/e2e_import.log" 2>/dev/null))"
  fi
  echo "gpu run.sh: exit status $status"
  exit $status
} 2>&1 | tee "$out/gpu-run.log"
exit "${PIPESTATUS[0]}"
