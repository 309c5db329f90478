// The safetensors export's format (docs/checkpoints.md, "safetensors"): an
// 8-byte little-endian header length, a JSON header (each tensor's dtype,
// shape and data offsets, and __metadata__.producer) padded with spaces to
// 8 bytes, then the data.  Kept apart from the engine, which only supplies
// the tensors' names, shapes and fp32 values; the JSON is built with
// nlohmann-json, not by hand.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pstar::checkpoint {

struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
};

// The header's JSON text, padded with spaces to a multiple of 8 bytes: every
// tensor as F32, in the order given, the data of each following the last.
// PSTAR_ERR_INVALID_ARGUMENT for a name that JSON cannot carry as given (not
// UTF-8) or that a reader would take for the metadata ("__metadata__").
std::string safetensors_header(const std::vector<SafetensorsEntry>& tensors, const std::string& producer);

// Writes the file: `path`.tmp, fsynced, then renamed to `path` (removed on
// failure).  `values(i, out)` fills `out`, already sized to tensors[i].numel,
// with tensor i's values.  Errors name export_safetensors.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::string& producer,
                       const std::function<void(size_t index, std::vector<float>& out)>& values);

}  // namespace pstar::checkpoint
