# Runs `pstar-bench gather` on a small model and checks its JSON lines
# (fixed keys, one line per depth, positive times, gathers issued ahead at
# depth > 0 and none at depth 0).  No timing assertion.
# Usage: cmake -DBENCH=<path to pstar-bench> -P check_gather_json.cmake
include(${CMAKE_CURRENT_LIST_DIR}/bench_json.cmake)
bench_run(out gather --ranks 2 --layers 4 --chunk-elems 65536 --compute-ms 1 --depths 0,2 --steps 4 --json)
string(REPLACE "\n" ";" lines "${out}")
set(rows 0)
foreach(line IN LISTS lines)
  bench_json_keys("${line}" bench ranks depth iter_s compute_s speedup_vs_depth0 acquire_s release_s gathers_ahead
                  gathers_on_demand gathers_waited)
  if(NOT v_bench STREQUAL "gather")
    message(FATAL_ERROR "\"bench\" is '${v_bench}': '${line}'")
  endif()
  bench_json_positive("${line}" iter_s speedup_vs_depth0 acquire_s release_s)
  # Depth 0 gathers at the acquire only; depth 2 gathers the 8 chunks of
  # each of the 3 iterations after the recorded one ahead.
  if(v_depth EQUAL 0 AND NOT v_gathers_ahead EQUAL 0)
    message(FATAL_ERROR "gathers ahead at depth 0: '${line}'")
  endif()
  if(v_depth EQUAL 2 AND NOT v_gathers_ahead EQUAL 24)
    message(FATAL_ERROR "expected 24 gathers ahead at depth 2: '${line}'")
  endif()
  math(EXPR rows "${rows} + 1")
endforeach()
if(NOT rows EQUAL 2)
  message(FATAL_ERROR "expected 2 lines (depths 0 and 2), got ${rows}:\n${out}")
endif()
message(STATUS "pstar-bench gather JSON OK (${rows} lines)")
