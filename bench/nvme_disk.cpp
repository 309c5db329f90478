#include "nvme_disk.h"

#include <chrono>
#include <vector>

#include "memory/nvme_store.h"
#include "util/error.h"

namespace pstar::bench {
namespace {

using memory::NvmeStore;

// Submits slot i from buffer i % depth for every slot, reusing a buffer once
// the request that last used it is retired; returns the seconds taken.
template <class Submit>
double run_sequential(NvmeStore& store, uint32_t requests, uint32_t depth, Submit submit) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<NvmeStore::Ticket> tickets(requests);
  for (uint32_t i = 0; i < requests; ++i) {
    if (i >= depth) store.wait(tickets[i - depth]);
    tickets[i] = submit(i, i % depth);
  }
  store.wait_all();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

DiskBandwidth measure_disk_bandwidth(const std::string& dir, uint64_t total_bytes, size_t io_bytes,
                                     uint32_t queue_depth) {
  require(total_bytes > 0 && io_bytes > 0 && queue_depth > 0, PSTAR_ERR_INVALID_ARGUMENT,
          "measure_disk_bandwidth: total_bytes, io_bytes and queue_depth must be positive");
  NvmeStore store(dir, queue_depth);
  const auto requests = static_cast<uint32_t>((total_bytes + io_bytes - 1) / io_bytes);
  for (uint32_t i = 0; i < requests; ++i) store.add_slot(io_bytes);
  // Distinct, non-constant contents: no filesystem can shortcut zeros.
  std::vector<NvmeStore::AlignedBuffer> buffers;
  for (uint32_t b = 0; b < queue_depth; ++b) {
    buffers.push_back(NvmeStore::allocate_aligned(io_bytes));
    for (size_t k = 0; k < io_bytes; ++k) buffers[b][k] = static_cast<uint8_t>(k * 131 + b * 7 + 1);
  }
  const double write_s = run_sequential(store, requests, queue_depth, [&](uint32_t slot, uint32_t b) {
    return store.write_async(slot, buffers[b].get(), io_bytes);
  });
  const double read_s = run_sequential(store, requests, queue_depth, [&](uint32_t slot, uint32_t b) {
    return store.read_async(slot, buffers[b].get(), io_bytes);
  });
  DiskBandwidth result;
  result.bytes = uint64_t{requests} * NvmeStore::padded(io_bytes);
  result.write_gbps = static_cast<double>(result.bytes) / write_s / 1e9;
  result.read_gbps = static_cast<double>(result.bytes) / read_s / 1e9;
  result.direct = store.direct();
  result.inflight_peak = store.stats().inflight_peak;
  return result;
}

}  // namespace pstar::bench
