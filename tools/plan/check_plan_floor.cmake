# Runs `pstar-plan --min-capacity --json` and checks one line per known
# shape: the fields exist, the floor lies between the largest chunk and the
# compute chunk bytes, and the GPT-2-small and ViT-B/16 floors are at most
# 0.3 of their compute chunk bytes (issue 21's target; the real models are
# trained at that capacity by tests/torch's torch_device_floor).
# Usage: cmake -DPLAN=<path to pstar-plan> -P check_plan_floor.cmake
execute_process(COMMAND ${PLAN} --min-capacity --json OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pstar-plan --min-capacity --json exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
string(STRIP "${out}" out)
string(REPLACE "\n" ";" lines "${out}")
set(models "")
foreach(line IN LISTS lines)
  foreach(key model floor_bytes compute_chunk_bytes floor_fraction chunk_elems)
    string(JSON ${key} ERROR_VARIABLE jerr GET "${line}" ${key})
    if(jerr)
      message(FATAL_ERROR "key ${key} missing in '${line}'")
    endif()
  endforeach()
  list(APPEND models ${model})
  # floor <= compute chunk bytes; floor >= one chunk of the default size
  # (every shape has a parameter use of that chunk), 2-byte dtype.
  math(EXPR chunk_bytes "${chunk_elems} * 2")
  if(floor_bytes GREATER compute_chunk_bytes OR floor_bytes LESS chunk_bytes)
    message(FATAL_ERROR "${model}: floor ${floor_bytes} not in [${chunk_bytes}, ${compute_chunk_bytes}]")
  endif()
  if(model STREQUAL "gpt2-small" OR model STREQUAL "vit-b-16")
    math(EXPR lhs "${floor_bytes} * 10")
    math(EXPR rhs "${compute_chunk_bytes} * 3")
    if(lhs GREATER rhs)
      message(FATAL_ERROR "${model}: floor_fraction ${floor_fraction} above 0.3")
    endif()
  endif()
  message(STATUS "${model}: floor ${floor_bytes} of ${compute_chunk_bytes} (${floor_fraction})")
endforeach()
if(NOT models STREQUAL "gpt2-small;gpt2-medium;vit-b-16;vit-l-16")
  message(FATAL_ERROR "unexpected shapes: ${models}")
endif()
