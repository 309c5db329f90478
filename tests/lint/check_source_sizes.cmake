# The size lint (CTest source_sizes): src/engine only sequences the modules,
# so its files together stay under PSTAR_ENGINE_MAX_LINES, and no file
# under src/ passes PSTAR_FILE_MAX_LINES.  A capability that would grow
# either belongs in its own module (step, placement, memory, chunk,
# checkpoint, distributed, optim, values): docs/design.md, "Layers".
#
#   cmake -DSRC=<source root>/src -P check_source_sizes.cmake
if(NOT DEFINED SRC)
  message(FATAL_ERROR "usage: cmake -DSRC=<source root>/src -P check_source_sizes.cmake")
endif()
get_filename_component(SRC "${SRC}" ABSOLUTE)
set(PSTAR_ENGINE_MAX_LINES 1500)
set(PSTAR_FILE_MAX_LINES 900)

# Lines as wc -l counts them: newline characters.
function(count_lines file out)
  file(READ "${file}" text)
  string(REGEX REPLACE "[^\n]" "" newlines "${text}")
  string(LENGTH "${newlines}" n)
  set(${out} ${n} PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE sources LIST_DIRECTORIES false "${SRC}/*")
list(LENGTH sources nsources)
if(nsources EQUAL 0)
  message(FATAL_ERROR "source_sizes: no files under ${SRC}")
endif()
set(failures "")
set(engine_total 0)
set(engine_files 0)
foreach(f IN LISTS sources)
  count_lines("${f}" n)
  file(RELATIVE_PATH rel "${SRC}" "${f}")
  if(n GREATER PSTAR_FILE_MAX_LINES)
    string(APPEND failures "  src/${rel}: ${n} lines (at most ${PSTAR_FILE_MAX_LINES} per file)\n")
  endif()
  if(rel MATCHES "^engine/")
    math(EXPR engine_total "${engine_total} + ${n}")
    math(EXPR engine_files "${engine_files} + 1")
  endif()
endforeach()
if(engine_files EQUAL 0)
  message(FATAL_ERROR "source_sizes: no files under ${SRC}/engine")
endif()
if(engine_total GREATER PSTAR_ENGINE_MAX_LINES)
  string(APPEND failures
    "  src/engine: ${engine_total} lines in ${engine_files} files (at most ${PSTAR_ENGINE_MAX_LINES}: move the "
    "capability's state and logic into its module, the engine only sequences calls)\n")
endif()
if(failures)
  message(FATAL_ERROR "source_sizes: over the limits\n${failures}")
endif()
message(STATUS "source_sizes: src/engine ${engine_total} lines in ${engine_files} files (limit "
               "${PSTAR_ENGINE_MAX_LINES}); ${nsources} files under src/, none over ${PSTAR_FILE_MAX_LINES} lines")
