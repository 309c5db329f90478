# Runs `pstar-bench access --iters 50 --reps 3 --json` and checks that it
# prints one well-formed JSON object with the fixed keys (no timing assertion).
# Usage: cmake -DBENCH=<path to pstar-bench> -P check_access_json.cmake
include(${CMAKE_CURRENT_LIST_DIR}/bench_json.cmake)
bench_run(out access --iters 50 --reps 3 --json)
if(out MATCHES "\n")
  message(FATAL_ERROR "expected one line of JSON, got:\n${out}")
endif()
bench_json_keys("${out}" bench ns_per_acquire_release min_ns_per_acquire_release params iters reps resident
                trace_moments trace_fallbacks)
if(NOT v_bench STREQUAL "access")
  message(FATAL_ERROR "\"bench\" is '${v_bench}', expected 'access'")
endif()
bench_json_positive("${out}" ns_per_acquire_release min_ns_per_acquire_release)
if(NOT v_iters EQUAL 50 OR NOT v_reps EQUAL 3 OR NOT v_params EQUAL 64)
  message(FATAL_ERROR "params/iters/reps are ${v_params}/${v_iters}/${v_reps}, expected 64/50/3")
endif()
if(NOT v_resident STREQUAL "ON")
  message(FATAL_ERROR "\"resident\" is '${v_resident}', expected true")
endif()
if(NOT v_trace_moments EQUAL 128 OR NOT v_trace_fallbacks EQUAL 0)
  message(FATAL_ERROR "trace_moments ${v_trace_moments} (expected 128), trace_fallbacks ${v_trace_fallbacks} (expected 0)")
endif()
message(STATUS "pstar-bench access JSON OK:\n${out}")
