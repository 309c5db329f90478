# Helpers of the bench smoke tests (check_*_json.cmake, run with cmake -P
# and -DBENCH=<path to pstar-bench>): run the benchmark, read keys of its
# JSON lines, check figures.  No timing assertions anywhere.

# bench_run(<out-var> <args>...): runs ${BENCH} <args>; fails with its
# output unless it exits 0; <out-var> receives stdout, stripped.
function(bench_run out_var)
  execute_process(COMMAND ${BENCH} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " args "${ARGN}")
    message(FATAL_ERROR "pstar-bench ${args} exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  string(STRIP "${out}" out)
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# bench_json_keys(<json> <key>...): sets v_<key> in the caller's scope to
# each key's value; fails naming the first key that is missing (or the
# line, if it is not a JSON object).
function(bench_json_keys json)
  foreach(key IN LISTS ARGN)
    string(JSON value ERROR_VARIABLE jerr GET "${json}" ${key})
    if(jerr)
      message(FATAL_ERROR "key \"${key}\" missing in '${json}' (${jerr})")
    endif()
    set(v_${key} "${value}" PARENT_SCOPE)
  endforeach()
endfunction()

# bench_json_positive(<json> <key>...): fails unless every v_<key> (read
# by bench_json_keys) is a positive number.
function(bench_json_positive json)
  foreach(key IN LISTS ARGN)
    if(NOT v_${key} MATCHES "^[0-9]" OR v_${key} MATCHES "^0(\\.0*)?$")
      message(FATAL_ERROR "\"${key}\" is not a positive number (${v_${key}}): '${json}'")
    endif()
  endforeach()
endfunction()
