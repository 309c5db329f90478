# Runs a small `pstar-bench overlap --json` and checks its lines: one JSON
# object per ratio, with the fixed keys (no timing assertion).
# Usage: cmake -DBENCH=<path to pstar-bench> -P check_overlap_json.cmake
include(${CMAKE_CURRENT_LIST_DIR}/bench_json.cmake)
bench_run(out overlap --layers 4 --layer-elems 65536 --ratios 0.5,2 --iters 2 --reps 2 --json)
string(REPLACE "\n" ";" lines "${out}")
list(LENGTH lines n)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "expected 2 lines of JSON (one per ratio), got ${n}:\n${out}")
endif()
set(expected_ratio 0.5 2)
foreach(i 0 1)
  list(GET lines ${i} line)
  list(GET expected_ratio ${i} ratio)
  bench_json_keys("${line}" bench compute_to_adam adam_s iteration_s_sync iteration_s_overlap speedup
                  exposed_optimizer_fraction ideal_speedup first_use_bound_speedup layers iters
                  reps iteration_s_speculative speedup_speculative exposed_optimizer_fraction_speculative
                  speculative_bound_speedup chunks_speculated_fraction speculations_discarded
                  adam_s_queued update_s_overlap step_wait_fraction optimizer_wait_fraction_sync
                  caller_sync caller_overlap caller_speculative grad_write)
  if(v_grad_write)
    message(FATAL_ERROR "grad_write is '${v_grad_write}' without --grad-write")
  endif()
  if(NOT v_bench STREQUAL "overlap")
    message(FATAL_ERROR "\"bench\" is '${v_bench}', expected 'overlap'")
  endif()
  if(NOT v_compute_to_adam EQUAL ratio)
    message(FATAL_ERROR "compute_to_adam is ${v_compute_to_adam}, expected ${ratio}")
  endif()
  bench_json_positive("${line}" adam_s iteration_s_sync iteration_s_overlap speedup iteration_s_speculative
                      speedup_speculative speculative_bound_speedup)
  if(NOT v_layers EQUAL 4 OR NOT v_iters EQUAL 2 OR NOT v_reps EQUAL 2)
    message(FATAL_ERROR "layers/iters/reps are ${v_layers}/${v_iters}/${v_reps}, expected 4/2/2")
  endif()
endforeach()
# The caller that writes its gradient: the grad_write part of each
# engine's caller time is there, and every part is a number.
bench_run(gw overlap --layers 2 --layer-elems 65536 --ratios 1 --iters 2 --reps 1 --grad-write --json)
bench_json_keys("${gw}" grad_write caller_sync caller_overlap caller_speculative)
if(NOT v_grad_write)
  message(FATAL_ERROR "grad_write is '${v_grad_write}' with --grad-write")
endif()
foreach(engine caller_sync caller_overlap caller_speculative)
  foreach(part compute forward_acquire forward_release backward_acquire grad_write backward_release step)
    string(JSON value ERROR_VARIABLE jerr GET "${gw}" ${engine} ${part})
    if(jerr OR NOT value MATCHES "^[0-9]")
      message(FATAL_ERROR "${engine}.${part} is not a number ('${value}' ${jerr}): '${gw}'")
    endif()
  endforeach()
endforeach()
message(STATUS "pstar-bench overlap JSON OK:\n${out}\n${gw}")
