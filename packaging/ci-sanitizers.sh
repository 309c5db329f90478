#!/usr/bin/env bash
# CI-only sanitizer runs (never the README's test command).
#   ci-sanitizers.sh asan  clang's AddressSanitizer + UndefinedBehaviorSanitizer
#                          (with LeakSanitizer): the unit, capi, dist and misuse tests,
#                          then the libFuzzer harness over the C API for 60 s
#                          (tests/fuzz/README.md)
#   ci-sanitizers.sh tsan  clang's ThreadSanitizer: the programs that drive the
#                          engine's mover (device worker), optimizer (thread
#                          pool), overlapped step (update thread), NVMe I/O and
#                          collective-queue threads: the C example in strict
#                          and normal mode, the access, overlap, nvme and
#                          gather benchmarks; and two caller threads on one
#                          engine (pstar_threads_stress: the check that refuses
#                          overlapping calls).  Criterion's test
#                          runner cannot start under TSan (its process arena is
#                          mapped at an address TSan reserves), so the
#                          Criterion suites run under ASan only.
# Any sanitizer report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/setup-sanitizers.sh
jobs=$(nproc)
case "${1:-}" in
  asan)
    cmake --preset asan > /dev/null
    cmake --build --preset asan -j "$jobs" > build/asan-build.log 2>&1 || { tail -50 build/asan-build.log; exit 1; }
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --preset asan -L 'unit|capi|dist|fuzz|misuse' -j "$jobs"
    # The C API under libFuzzer for 60 s from a copy of the committed corpus.
    rm -rf build/fuzz-corpus && mkdir -p build/fuzz-corpus && cp tests/fuzz/corpus/* build/fuzz-corpus/
    if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        build/asan/bin/fuzz_capi -max_total_time=60 -timeout=20 -print_final_stats=1 build/fuzz-corpus \
        > build/fuzz.log 2>&1; then
      tail -80 build/fuzz.log
      echo "fuzz_capi: a finding (the input is in the current directory as crash-*/leak-*/timeout-*)"
      exit 1
    fi
    grep -E "^Done|^stat::number_of_executed_units|^stat::peak_rss" build/fuzz.log || true
    ;;
  tsan)
    cmake --preset tsan > /dev/null
    cmake --build --preset tsan -j "$jobs" --target pstar-example-mlp pstar-bench pstar_threads_stress pstar-run \
      > build/tsan-build.log 2>&1 ||
      { tail -50 build/tsan-build.log; exit 1; }
    export TSAN_OPTIONS=halt_on_error=1:exitcode=66
    build/tsan/bin/pstar-example-mlp --steps 20 --strict
    build/tsan/bin/pstar-example-mlp --steps 20
    # Hyperparameters set inside the iteration while the update thread runs
    # the previous step's updates (no wait there).
    build/tsan/bin/pstar-example-mlp --steps 20 --late-lr --check
    # Two ranks: each one's overlapped step updates its shards on its update
    # thread; with --hybrid some shards are updated on the device.
    build/tsan/bin/pstar-run -n 2 --timeout 300 -- build/tsan/bin/pstar-example-mlp --steps 10
    build/tsan/bin/pstar-run -n 2 --timeout 300 -- build/tsan/bin/pstar-example-mlp --steps 10 --hybrid \
      --device-capacity 1m --check
    build/tsan/bin/pstar-bench access --iters 50 --reps 1
    # The overlapped step: the update thread against the engine's thread
    # and the device's workers, synchronous and overlapped engines.
    build/tsan/bin/pstar-bench overlap --layers 4 --layer-elems 65536 --ratios 1 --iters 2 --reps 2
    # Two threads on one engine: a trainer and a reader, two trainers, a
    # hand-off (tests/capi/threads_stress.c).
    build/tsan/bin/pstar_threads_stress 20
    # The NVMe tier: the store's I/O thread and libuv's pool against the step.
    rm -rf build/tsan-nvme && mkdir -p build/tsan-nvme
    build/tsan/bin/pstar-bench nvme --dir build/tsan-nvme --elements 1048576 --chunk-elems 262144 --reps 2 \
      --disk-bytes 16777216
    # Two ranks gathering ahead: the collective queue's thread against the
    # engine's, Gloo's and the heartbeat's.
    build/tsan/bin/pstar-bench gather --layers 4 --chunk-elems 65536 --compute-ms 1 --depths 0,2 --steps 4
    echo "tsan: no reports"
    ;;
  *)
    echo "usage: ci-sanitizers.sh asan|tsan" >&2
    exit 2
    ;;
esac
