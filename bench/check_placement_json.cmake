# Runs `pstar-bench placement` on the smallest GPT shape at two budgets and
# checks the JSON lines: every policy present with the fixed keys, and no
# policy below the independent lower bounds on bytes and on stall time (the
# bench itself exits 1 then);
# opt_hybrid (hybrid placement keeps payloads across the step, so the
# bound, which starts from an empty device, does not apply to it) only
# within its bytes.
# No timing assertion.
# Usage: cmake -DBENCH=<path to pstar-bench> -P check_placement_json.cmake
include(${CMAKE_CURRENT_LIST_DIR}/bench_json.cmake)
bench_run(out placement --models gpt-4l-256h --fractions 0.3,0.7 --json)
string(REPLACE "\n" ";" lines "${out}")
set(rows 0)
set(seen "")
foreach(line IN LISTS lines)
  bench_json_keys("${line}" bench)
  if(NOT v_bench STREQUAL "placement")
    continue()
  endif()
  bench_json_keys("${line}" model budget_fraction policy feasible bytes_moved critical_bytes lower_bound_bytes
                  stall_seconds stall_seconds_lower_bound)
  if(NOT v_feasible STREQUAL "ON")
    message(FATAL_ERROR "row not feasible: '${line}'")
  endif()
  if(NOT v_policy STREQUAL "opt_hybrid" AND (v_bytes_moved LESS v_lower_bound_bytes OR v_lower_bound_bytes EQUAL 0))
    message(FATAL_ERROR "bytes_moved ${v_bytes_moved} below (or bound zero) lower_bound_bytes ${v_lower_bound_bytes}: '${line}'")
  endif()
  if(v_critical_bytes GREATER v_bytes_moved)
    message(FATAL_ERROR "critical_bytes above bytes_moved: '${line}'")
  endif()
  list(APPEND seen "${v_policy}")
  math(EXPR rows "${rows} + 1")
endforeach()
if(NOT rows EQUAL 10)
  message(FATAL_ERROR "expected 10 placement rows (5 policies x 2 budgets), got ${rows}:\n${out}")
endif()
foreach(policy opt opt_noprefetch lru static opt_hybrid)
  list(FIND seen ${policy} idx)
  if(idx EQUAL -1)
    message(FATAL_ERROR "policy ${policy} missing:\n${out}")
  endif()
endforeach()
message(STATUS "pstar-bench placement JSON OK (${rows} rows)")

# Budgets at which the engine accumulates some gradients on the host (no
# device buffer fits): the lower bound must still be one (before it
# assumed every buffer on the device, and at these budgets every policy
# moved fewer bytes than it, so the bench exited 1).
bench_run(tight placement --models gpt-8l-512h --fractions 0.1 --json)
bench_run(tight48 placement --models gpt-48l-1024h --fractions 0.04 --json)
message(STATUS "pstar-bench placement: the bound holds where gradients go to the host")

# The CPU update modelled (--host-update-gbps): it overlaps the next
# iteration on the clock, and the forward waits for it, so opt's stall
# grows past the update-free run's (the bound, which leaves the update out,
# still holds: the bench exits 1 otherwise).
function(opt_stall out_var)
  bench_run(out placement --models gpt-4l-256h --fractions 0.5 --json ${ARGN})
  string(REPLACE "\n" ";" lines "${out}")
  foreach(line IN LISTS lines)
    string(JSON policy ERROR_VARIABLE jerr GET "${line}" policy)
    if(NOT jerr AND policy STREQUAL "opt")
      bench_json_keys("${line}" stall_seconds)
      set(${out_var} "${v_stall_seconds}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "no opt row:\n${out}")
endfunction()
opt_stall(free)
opt_stall(updating --host-update-gbps 20)
if(NOT updating GREATER free)
  message(FATAL_ERROR "the modelled update did not lengthen opt's stall: ${updating} s vs ${free} s")
endif()
message(STATUS "pstar-bench placement: the modelled CPU update shows (stall ${free} s -> ${updating} s)")
