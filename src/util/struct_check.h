// The rule for versioned structs (the conventions of pstar.h), shared by the
// C API shims (result structs, experimental options) and the core (engine
// options): a struct is accepted when its version is one the library knows,
// its size covers that version's fields, the size is at most
// PSTAR_STRUCT_SIZE_MAX, and every byte past the library's own struct is
// zero.  The size is the caller's promise that so many bytes are allocated;
// the tail check reads them, which is why the size is bounded first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "pstar/pstar.h"
#include "util/error.h"

namespace pstar {

// Checks the caller's struct at `s`, whose header says `size` and `version`:
// `version` in 1..known_versions, `size` >= covered[version - 1] (the bytes
// that version's fields end at) and <= PSTAR_STRUCT_SIZE_MAX, and the bytes
// [library_size, size) of `s` zero.  Throws Error(PSTAR_ERR_VERSION) with a
// message beginning with `what`.  Reads nothing of `s` beyond its first
// `size` bytes, and nothing at all past the header when the size is out of
// bounds.
inline void require_versioned_struct(const void* s, uint32_t size, uint32_t version, size_t known_versions,
                                     const size_t* covered, size_t library_size, const char* what) {
  require(version >= 1 && version <= known_versions, PSTAR_ERR_VERSION, [&] {
    return std::string(what) + ": version " + std::to_string(version) + " is not supported by this library (knows 1.." +
           std::to_string(known_versions) + "); initialise it with its _init() function";
  });
  const size_t needed = covered[version - 1];
  require(size >= needed, PSTAR_ERR_VERSION, [&] {
    return std::string(what) + ": size " + std::to_string(size) + " is smaller than a version-" +
           std::to_string(version) + " struct (" + std::to_string(needed) + " bytes)";
  });
  require(size <= PSTAR_STRUCT_SIZE_MAX, PSTAR_ERR_VERSION, [&] {
    return std::string(what) + ": size " + std::to_string(size) + " is larger than PSTAR_STRUCT_SIZE_MAX (" +
           std::to_string(PSTAR_STRUCT_SIZE_MAX) + " bytes)";
  });
  const unsigned char* bytes = static_cast<const unsigned char*>(s);
  for (size_t i = library_size; i < size; ++i) {
    require(bytes[i] == 0, PSTAR_ERR_VERSION, [&] {
      return std::string(what) + ": size " + std::to_string(size) + " is larger than this library's struct (" +
             std::to_string(library_size) + " bytes) and byte " + std::to_string(i) +
             " of it is not zero (a field this library does not know, or garbage); initialise it with its _init() "
             "function";
    });
  }
}

// Writes the library's filled struct `s` into the caller's `out`, whose
// header (already checked by require_versioned_struct) says how many bytes
// it holds: no more than that many are written, and the header keeps the
// caller's size and version (its version says which fields it has).
template <typename T>
void write_versioned_struct(T* out, T s) {
  s.size = out->size;
  s.version = out->version;
  std::memcpy(out, &s, std::min<size_t>(out->size, sizeof s));
}

}  // namespace pstar
