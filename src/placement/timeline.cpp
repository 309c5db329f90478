#include "placement/timeline.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

#ifndef PSTAR_VERSION_STRING
#include "pstar/version.h"
#endif

namespace pstar::placement {

namespace {
using Json = nlohmann::ordered_json;  // keys in the order written (the tests and viewers read it so)

// Track ids of the two move directions.
constexpr int kTidHostToDevice = 1;
constexpr int kTidDeviceToHost = 2;
constexpr double kMicrosPerSecond = 1e6;  // Chrome traces count microseconds

Json counter(const char* name, double seconds, Json args) {
  return Json{{"name", name}, {"ph", "C"}, {"ts", seconds * kMicrosPerSecond}, {"pid", 1}, {"args", std::move(args)}};
}
}  // namespace

void Timeline::note_move(bool to_device, uint32_t chunk, uint64_t bytes, double start, double end) {
  moves_.push_back(MoveRecord{to_device, chunk, bytes, start, end});
}

void Timeline::write(const std::string& path, const char* clock) const {
  Json events = Json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "libpstar engine"}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 1},
                    {"tid", kTidHostToDevice},
                    {"args", {{"name", "host to device"}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 1},
                    {"tid", kTidDeviceToHost},
                    {"args", {{"name", "device to host"}}}});
  for (const MoveRecord& m : moves_) {
    const double dur = std::isnan(m.end) ? 0.0 : (m.end - m.start) * kMicrosPerSecond;
    events.push_back({{"name", "chunk " + std::to_string(m.chunk)},
                      {"cat", "move"},
                      {"ph", "X"},
                      {"ts", m.start * kMicrosPerSecond},
                      {"dur", dur},
                      {"pid", 1},
                      {"tid", m.to_device ? kTidHostToDevice : kTidDeviceToHost},
                      {"args", {{"bytes", m.bytes}}}});
  }
  Json rows = Json::array();
  for (const MemorySample& m : samples_) {
    events.push_back(counter("accelerator bytes", m.time,
                             {{"chunks", m.chunks},
                              {"gradient buffers", m.grads},
                              {"non-model", m.nonmodel},
                              {"freeing", m.deferred},
                              {"optimizer state", m.optimizer}}));
    events.push_back(counter("host bytes", m.time, {{"held", m.host}}));
    rows.push_back({m.moment, m.time, m.chunks, m.grads, m.nonmodel, m.deferred, m.host, m.optimizer});
  }
  const Json doc = {
      {"displayTimeUnit", "ms"},
      {"otherData", {{"producer", std::string("libpstar ") + PSTAR_VERSION_STRING}, {"clock", clock}}},
      {"traceEvents", std::move(events)},
      {"pstarMoments",
       {{"columns", {"moment", "seconds", "chunks", "gradient_buffers", "non_model", "freeing", "host", "optimizer"}},
        {"rows", std::move(rows)}}}};
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  require(f.is_open(), PSTAR_ERR_IO, [&] { return "trace_export: cannot open '" + path + "' for writing"; });
  f << doc.dump() << '\n';
  f.close();
  require(!f.fail(), PSTAR_ERR_IO, [&] { return "trace_export: writing '" + path + "' failed"; });
}

}  // namespace pstar::placement
