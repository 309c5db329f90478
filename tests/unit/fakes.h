// Stand-ins shared by the unit tests of src/distributed and src/placement: a
// communicator whose collectives run what the test scripts, and a chunk
// table over a vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "chunk/chunk.h"
#include "distributed/comm/communicator.h"
#include "placement/runtime.h"

namespace pstar::testing {

// Rank `rank` of `size`; each collective calls the test's function, if
// set, and does nothing otherwise.
class ScriptedComm final : public distributed::Communicator {
 public:
  ScriptedComm(int rank, int size, bool device_buffers = false)
      : rank_(rank), size_(size), device_buffers_(device_buffers) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "scripted"; }
  bool failed() const override { return false; }
  bool device_buffers() const override { return device_buffers_; }
  void all_gather(const void* shard, void* out, size_t shard_bytes) override {
    if (on_all_gather) on_all_gather(shard, out, shard_bytes);
  }
  void reduce_scatter_sum(float* data, float* out, size_t block_elems) override {
    if (on_reduce_scatter) on_reduce_scatter(data, out, block_elems);
  }
  void all_reduce_sum(double*, size_t) override {}
  void all_reduce_max(int64_t*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}

  std::function<void(const void*, void*, size_t)> on_all_gather;
  std::function<void(float*, float*, size_t)> on_reduce_scatter;

 private:
  int rank_, size_;
  bool device_buffers_;
};

struct VectorChunkTable final : placement::ChunkTable {
  std::vector<chunk::Chunk> v;
  size_t chunk_count() const override { return v.size(); }
  chunk::Chunk& chunk_at(uint32_t k) override { return v[k]; }
};

}  // namespace pstar::testing
