// ReduceScatter (reduce_scatter.h): the buffer pairs, the queue of
// reduce-scatters in flight, and the average.
#include "distributed/reduce_scatter.h"

#include <algorithm>
#include <string>
#include <utility>

#include "util/error.h"

namespace pstar::distributed {

void ReduceScatter::reserve(memory::HostPool* host, uint64_t largest_elems, bool asynchronous) {
  host_ = host;
  const bool host_staging = !group_->device_buffers();
  try {
    pairs_.resize(asynchronous ? kAsyncPairs : 1);
    for (Pair& p : pairs_) {
      p.out_bytes = largest_elems / static_cast<uint64_t>(group_->world()) * sizeof(float);
      p.out = static_cast<float*>(host_->acquire(p.out_bytes));
      if (host_staging) {
        p.staging_bytes = largest_elems * sizeof(float);
        p.staging = static_cast<float*>(host_->acquire(p.staging_bytes));
      }
    }
  } catch (...) {
    release();
    throw;
  }
}

void ReduceScatter::release() {
  for (Pending& p : queued_) free_stage(p);
  queued_.clear();
  for (Pair& p : pairs_) {
    host_->release(p.staging, p.staging_bytes);
    host_->release(p.out, p.out_bytes);
  }
  pairs_.clear();
}

void ReduceScatter::free_stage(Pending& p) {
  if (p.device_stage == nullptr) return;
  actions_.stage_free(p.device_stage, p.device_stage_bytes);
  p.device_stage = nullptr;
}

void ReduceScatter::reduce(uint32_t k, uint64_t elems, uint64_t shard_elems) {
  // A free pair; with all in use by queued reduce-scatters, the oldest is
  // finished first.
  if (queued_.size() >= pairs_.size()) finish_oldest();
  size_t b = 0;
  while (std::any_of(queued_.begin(), queued_.end(), [&](const Pending& q) { return q.pair == b; })) ++b;
  Pair& pair = pairs_.at(b);
  if (pair.out == nullptr || shard_elems * sizeof(float) > pair.out_bytes) internal_error("no reduce-scatter output");
  Pending p;
  p.chunk = k;
  p.elems = elems;
  p.shard_elems = shard_elems;
  p.pair = b;
  float* data = nullptr;
  float* out = nullptr;
  if (group_->device_buffers()) {
    // The chunk and this rank's block of the sum, back to back on the
    // device; the block is copied to the host pair when finished.
    p.device_stage_bytes = (elems + shard_elems) * sizeof(float);
    p.device_stage = actions_.stage_alloc(p.device_stage_bytes, k);
    data = static_cast<float*>(p.device_stage);
    out = data + elems;
  } else {
    if (pair.staging == nullptr || elems * sizeof(float) > pair.staging_bytes)
      internal_error("no reduce-scatter staging");
    data = pair.staging;
    out = pair.out;
  }
  try {
    p.params = actions_.lay_out(k, data, elems);
  } catch (...) {
    free_stage(p);
    throw;
  }
  if (!group_->has_queue()) {
    try {
      group_->run("reduce-scatter of gradients", CollectiveKind::kReduce, k,
                  [&] { group_->comm().reduce_scatter_sum(data, out, shard_elems); });
    } catch (...) {
      free_stage(p);
      throw;
    }
    finish(p);
    return;
  }
  Communicator* comm = &group_->comm();
  p.ticket = group_->submit("reduce-scatter of gradients", CollectiveKind::kReduce, k,
                            [comm, data, out, shard_elems] { comm->reduce_scatter_sum(data, out, shard_elems); });
  queued_.push_back(std::move(p));
}

// The reduce-scatter of `p` is done: this rank's block of the sum (copied
// from the device stage with a device-memory communicator) is averaged and
// applied.
void ReduceScatter::finish(Pending& p) {
  float* avg = pairs_[p.pair].out;
  if (p.device_stage != nullptr) {
    try {
      actions_.copy_to_host(avg, static_cast<const float*>(p.device_stage) + p.elems, p.shard_elems * sizeof(float));
    } catch (...) {
      free_stage(p);
      throw;
    }
    free_stage(p);
  }
  const float n = static_cast<float>(group_->world());
  for (uint64_t i = 0; i < p.shard_elems; ++i) avg[i] = avg[i] / n;
  actions_.apply(p.chunk, p.params, avg);
}

void ReduceScatter::finish_oldest() {
  Pending p = std::move(queued_.front());
  queued_.pop_front();
  std::string failure;
  if (group_->wait_failed(p.ticket, &failure)) {
    free_stage(p);
    group_->fail("reduce-scatter of gradients", failure);
  }
  finish(p);
}

void ReduceScatter::finish_through(int64_t k) {
  size_t n = queued_.size();
  if (k >= 0) {
    while (n > 0 && queued_[n - 1].chunk != static_cast<uint32_t>(k)) --n;
  }
  for (size_t i = 0; i < n; ++i) finish_oldest();
}

bool ReduceScatter::release_oldest_stage() {
  if (queued_.empty() || queued_.front().device_stage == nullptr) return false;
  finish_oldest();  // frees its device staging (a local wait)
  return true;
}

}  // namespace pstar::distributed
