# Runs `pstar-bench adam --elements 1M --reps 3 --json` and checks that it
# prints one well-formed JSON object per dtype with the fixed keys, then one
# per Adam state format (bench "adam_states": fp32, bf16, int8).
# Usage: cmake -DBENCH=<path to pstar-bench> -P check_bench_json.cmake
include(${CMAKE_CURRENT_LIST_DIR}/bench_json.cmake)
bench_run(out adam --elements 1M --reps 3 --json)
string(REPLACE "\n" ";" lines "${out}")
set(seen "")
set(formats "")
foreach(line IN LISTS lines)
  bench_json_keys("${line}" bench)
  if(v_bench STREQUAL "adam_states")
    bench_json_keys("${line}" state_format bytes_per_elem elems_per_s bound_fraction vs_fp32 memory_ceiling_eps
                    memory_ceiling_eps_prefetch_off memory_ceiling_eps_prefetch_on memory_ceiling_prefetch
                    compute_ceiling_eps limit finite)
    bench_json_positive("${line}" bytes_per_elem elems_per_s bound_fraction vs_fp32 memory_ceiling_eps
                        memory_ceiling_eps_prefetch_off memory_ceiling_eps_prefetch_on compute_ceiling_eps)
    # The memory ceiling is the faster of the two streams.
    if(v_memory_ceiling_eps LESS v_memory_ceiling_eps_prefetch_off OR v_memory_ceiling_eps LESS
                                                                       v_memory_ceiling_eps_prefetch_on)
      message(FATAL_ERROR "state format ${v_state_format}: memory_ceiling_eps is not the faster stream: '${line}'")
    endif()
    if(NOT v_finite STREQUAL "ON" AND NOT v_finite STREQUAL "true")
      message(FATAL_ERROR "state format ${v_state_format}: non-finite values: '${line}'")
    endif()
    list(APPEND formats ${v_state_format})
    continue()
  endif()
  bench_json_keys("${line}" bench dtype isa threads elements median_s elems_per_s bytes_per_elem ceiling_gbs triad_gbs
                  ceiling_gbs_prefetch_off ceiling_gbs_prefetch_on ceiling_prefetch bound_fraction)
  if(v_ceiling_gbs LESS v_ceiling_gbs_prefetch_off OR v_ceiling_gbs LESS v_ceiling_gbs_prefetch_on)
    message(FATAL_ERROR "ceiling_gbs is not the faster stream: '${line}'")
  endif()
  if(NOT v_bench STREQUAL "adam")
    message(FATAL_ERROR "\"bench\" is '${v_bench}', expected 'adam'")
  endif()
  if(NOT v_elements EQUAL 1000000)
    message(FATAL_ERROR "elements is ${v_elements}, expected 1000000")
  endif()
  if(NOT v_bytes_per_elem EQUAL 28)
    message(FATAL_ERROR "bytes_per_elem is ${v_bytes_per_elem}, expected 28")
  endif()
  bench_json_positive("${line}" median_s elems_per_s ceiling_gbs ceiling_gbs_prefetch_off ceiling_gbs_prefetch_on
                      triad_gbs bound_fraction)
  list(APPEND seen ${v_dtype})
endforeach()
list(SORT seen)
if(NOT seen STREQUAL "bf16;fp16")
  message(FATAL_ERROR "expected one line each for fp16 and bf16, got '${seen}'\n${out}")
endif()
list(SORT formats)
if(NOT formats STREQUAL "bf16;fp32;int8")
  message(FATAL_ERROR "expected one adam_states line each for fp32, bf16 and int8, got '${formats}'\n${out}")
endif()
message(STATUS "pstar-bench JSON OK:\n${out}")
