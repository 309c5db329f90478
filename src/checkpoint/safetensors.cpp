// The safetensors export (safetensors.h): the JSON header through
// nlohmann::ordered_json (keys in the order written: __metadata__ first,
// then the tensors in registration order), and the file written through the
// checked writer.  For names that are printable UTF-8 the header is the
// same text, byte for byte, as the hand-built one it replaces.
#include "checkpoint/safetensors.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "checkpoint/files.h"
#include "util/error.h"

namespace pstar::checkpoint {

std::string safetensors_header(const std::vector<SafetensorsEntry>& tensors, const std::string& producer) {
  using nlohmann::ordered_json;
  ordered_json header = ordered_json::object();
  header["__metadata__"] = ordered_json::object({{"producer", producer}});
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    try {
      (void)ordered_json(t.name).dump();
    } catch (const ordered_json::type_error&) {
      throw Error(PSTAR_ERR_INVALID_ARGUMENT, "export_safetensors: parameter '" + t.name +
                                                  "' has a name that is not UTF-8, which a safetensors header "
                                                  "(JSON) cannot hold");
    }
    if (t.name == "__metadata__") {
      throw Error(PSTAR_ERR_INVALID_ARGUMENT,
                  "export_safetensors: a parameter named '__metadata__' would be read as the file's metadata");
    }
    ordered_json entry = ordered_json::object();
    entry["dtype"] = "F32";
    entry["shape"] = ordered_json::array();
    for (int64_t d : t.shape) entry["shape"].push_back(d);
    entry["data_offsets"] = ordered_json::array({offset, offset + t.numel * 4});
    header[t.name] = std::move(entry);
    offset += t.numel * 4;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  return text;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::string& producer,
                       const std::function<void(size_t index, std::vector<float>& out)>& values) {
  const std::string header = safetensors_header(tensors, producer);
  const std::string tmp = path + ".tmp";
  try {
    CheckedWriter w(tmp, "export_safetensors");
    unsigned char len[8];
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    w.write(len, 8);
    w.write(header.data(), header.size());
    std::vector<float> staging;
    for (size_t i = 0; i < tensors.size(); ++i) {
      staging.resize(tensors[i].numel);
      values(i, staging);
      w.write(staging.data(), staging.size() * sizeof(float));
    }
    w.finish();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    io_error("export_safetensors: renaming to '" + path + "': " + errno_text());
}

}  // namespace pstar::checkpoint
