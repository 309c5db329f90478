# One version (project(pstar VERSION ...) in CMakeLists.txt) everywhere: the
# header, pstar.pc and the CMake package are configured from it, the Debian
# changelog is written from it (build-debs.sh) and the Python package reads it
# (pyproject.toml's regex provider).  The Rust crates and the Julia package
# cannot read it, so this test (label packaging) fails when they drift.
# Usage: cmake -DSOURCE_DIR=... -DVERSION=... -DBINARY_DIR=... -P check_versions.cmake
set(_files
  bindings/rust/pstar-sys/Cargo.toml
  bindings/rust/pstar/Cargo.toml
  bindings/julia/Pstar/Project.toml)
set(_bad "")
foreach(f ${_files})
  file(STRINGS ${SOURCE_DIR}/${f} _line REGEX "^version = ")
  if(NOT _line STREQUAL "version = \"${VERSION}\"")
    list(APPEND _bad "${f}: '${_line}'")
  endif()
endforeach()
file(READ ${SOURCE_DIR}/bindings/python/pyproject.toml _py)
if(NOT _py MATCHES "dynamic = \\[\"version\"\\]" OR NOT _py MATCHES "input = \"../../CMakeLists.txt\"")
  list(APPEND _bad "bindings/python/pyproject.toml: version not read from CMakeLists.txt")
endif()
file(STRINGS ${BINARY_DIR}/pstar.pc _pc REGEX "^Version: ")
if(NOT _pc STREQUAL "Version: ${VERSION}")
  list(APPEND _bad "pstar.pc: '${_pc}'")
endif()
file(READ ${BINARY_DIR}/capi/include/pstar/version.h _h)
string(REPLACE "." ";" _parts ${VERSION})
list(GET _parts 0 _major)
list(GET _parts 1 _minor)
list(GET _parts 2 _patch)
if(NOT _h MATCHES "PSTAR_VERSION_MAJOR ${_major}\n" OR NOT _h MATCHES "PSTAR_VERSION_MINOR ${_minor}\n"
   OR NOT _h MATCHES "PSTAR_VERSION_PATCH ${_patch}\n")
  list(APPEND _bad "version.h does not say ${VERSION}")
endif()
if(_bad)
  list(JOIN _bad "\n  " _msg)
  message(FATAL_ERROR "versions differ from ${VERSION} (CMakeLists.txt):\n  ${_msg}")
endif()
message(STATUS "every version is ${VERSION}")
