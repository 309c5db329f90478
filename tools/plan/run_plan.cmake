# run_plan(VAR [ARGS...]) for the planner's CTest scripts: runs
# `${PLAN} --preset ${PRESET} --json ARGS`, fails unless it exits 0 with one
# line that is the planner's JSON object, and sets VAR to that line.
function(run_plan var)
  execute_process(
    COMMAND ${PLAN} --preset ${PRESET} --json ${ARGN}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pstar-plan --preset ${PRESET} --json ${ARGN} exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  string(STRIP "${out}" out)
  if(out MATCHES "\n")
    message(FATAL_ERROR "expected one line of JSON, got:\n${out}")
  endif()
  string(JSON planner ERROR_VARIABLE jerr GET "${out}" planner)
  if(jerr OR NOT planner STREQUAL "pstar-plan")
    message(FATAL_ERROR "not the planner's JSON object: '${out}' (${jerr})")
  endif()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()
