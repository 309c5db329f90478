# Runs `pstar-plan --preset PRESET --json` (hybrid optimizer placement, the
# default) and with --no-hybrid, and checks that each prints one JSON object
# whose figures exist and are positive, and that the two agree.
# Usage: cmake -DPLAN=<path to pstar-plan> -DPRESET=v100x8 -P check_plan_json.cmake
include(${CMAKE_CURRENT_LIST_DIR}/run_plan.cmake)
run_plan(out)
run_plan(out_nohybrid --no-hybrid)

# Positive numbers, at the top level and in the largest model's record.
function(expect_positive json path)
  string(JSON value ERROR_VARIABLE jerr GET "${json}" ${path})
  if(jerr)
    message(FATAL_ERROR "key ${path} missing in '${json}'")
  endif()
  if(NOT value MATCHES "^[0-9]+(\\.[0-9]*)?([eE][+-]?[0-9]+)?$" OR value MATCHES "^0+(\\.0*)?$")
    message(FATAL_ERROR "${path} is not a positive number: '${value}'")
  endif()
  message(STATUS "${path} = ${value}")
endfunction()
foreach(key max_params bytes_moved_per_iter step_s chunk_elems chunk_count fill_ratio peak_device_bytes
            host_needed_per_node_bytes dry_runs)
  expect_positive("${out}" ${key})
endforeach()
foreach(key layers hidden heads vocab seq batch)
  expect_positive("${out}" "max_shape;${key}")
endforeach()
foreach(key params flops_per_iter compute_s adam_s device_capacity_bytes)
  expect_positive("${out}" "max;${key}")
endforeach()
string(JSON fits GET "${out}" max fits)
if(NOT fits STREQUAL "ON")
  message(FATAL_ERROR "the largest model found does not fit: ${fits}")
endif()

string(JSON step GET "${out}" max step_s)
string(JSON compute GET "${out}" max compute_s)
string(JSON wait GET "${out}" max wait_s)
string(JSON adam GET "${out}" max adam_s)
if(step LESS compute)
  message(FATAL_ERROR "step ${step} s is shorter than its compute ${compute} s")
endif()
# The presets' 8 ranks: their collectives predicted and timed.
expect_positive("${out}" collective_s)
expect_positive("${out}" "max;all_gathered_bytes_per_iter")
expect_positive("${out}" "max;reduce_scattered_bytes_per_iter")
# The overlapped step: no longer than the synchronous one, no shorter than
# its compute.
expect_positive("${out}" step_s_overlap)
string(JSON overlap GET "${out}" max step_s_overlap)
if(overlap GREATER step OR overlap LESS compute)
  message(FATAL_ERROR "overlapped step ${overlap} s outside [compute ${compute} s, step ${step} s]")
endif()

# Hybrid placement: the figures without it, the state placed per rank, and
# the order of the searches (hybrid fits at least what host-only fits; the
# what-ifs at least what hybrid fits).
string(JSON hybrid GET "${out}" hybrid_optimizer)
string(JSON hybrid_off GET "${out_nohybrid}" hybrid_optimizer)
if(NOT hybrid STREQUAL "ON" OR NOT hybrid_off STREQUAL "OFF")
  message(FATAL_ERROR "hybrid_optimizer: '${hybrid}' by default, '${hybrid_off}' with --no-hybrid")
endif()
foreach(key max_params_host_only bytes_moved_per_iter_host_only step_s_host_only max_params_hybrid_steady_host
            max_params_with_device_margin)
  expect_positive("${out}" ${key})
endforeach()
function(expect_number json path)
  string(JSON value ERROR_VARIABLE jerr GET "${json}" ${path})
  if(jerr OR NOT value MATCHES "^[0-9]+(\\.[0-9]*)?([eE][+-]?[0-9]+)?$")
    message(FATAL_ERROR "${path} is missing or not a number >= 0: '${value}'")
  endif()
  message(STATUS "${path} = ${value}")
endfunction()
expect_number("${out}" optimizer_device_bytes_per_rank)
foreach(key optimizer_device_bytes optimizer_chunks_on_device device_adam_s host_adam_s
            host_needed_per_node_after_placement_bytes)
  expect_number("${out}" "max;${key}")
endforeach()
string(JSON p_hybrid GET "${out}" max_params)
string(JSON p_host GET "${out}" max_params_host_only)
string(JSON p_steady GET "${out}" max_params_hybrid_steady_host)
string(JSON p_margin GET "${out}" max_params_with_device_margin)
string(JSON p_off GET "${out_nohybrid}" max_params)
string(JSON p_off_host GET "${out_nohybrid}" max_params_host_only)
if(NOT p_off EQUAL p_host OR NOT p_off_host EQUAL p_off)
  message(FATAL_ERROR "--no-hybrid finds ${p_off} (host-only ${p_off_host}), the default run's host-only search ${p_host}")
endif()
if(p_hybrid LESS p_host OR p_steady LESS p_hybrid OR p_margin LESS p_hybrid)
  message(FATAL_ERROR "searches out of order: hybrid ${p_hybrid}, host-only ${p_host}, steady host ${p_steady}, "
                      "device margin ${p_margin}")
endif()
string(JSON h_peak GET "${out}" max host_needed_per_node_bytes)
string(JSON h_after GET "${out}" max host_needed_per_node_after_placement_bytes)
if(h_peak LESS h_after)
  message(FATAL_ERROR "host need after placement ${h_after} exceeds the warm-up's ${h_peak}")
endif()
message(STATUS "max_params: hybrid ${p_hybrid}, host-only ${p_host}, what-ifs: steady host ${p_steady}, "
               "device margin ${p_margin}")

string(JSON n_assumptions LENGTH "${out}" assumptions)
string(JSON n_published LENGTH "${out}" published)
if(n_assumptions LESS 5 OR n_published LESS 1)
  message(FATAL_ERROR "assumptions (${n_assumptions}) or published figures (${n_published}) missing")
endif()
message(STATUS "pstar-plan --preset ${PRESET} --json OK (step ${step} s = compute ${compute} + wait ${wait} + Adam ${adam})")
