#include "values/param_values.h"

#include <cstring>
#include <vector>

#include "util/dtype.h"
#include "util/error.h"

namespace pstar::values {

void ensure_moments(memory::HostPool& host, chunk::ChunkState& c, uint64_t bytes, bool zero_fill) {
  for (float** b : {&c.exp_avg, &c.exp_avg_sq}) {
    if (*b != nullptr) continue;
    *b = static_cast<float*>(host.acquire(bytes));
    if (zero_fill) std::memset(*b, 0, bytes);
  }
}

using chunk::Tier;
using HostLists = placement::HybridPlacement::HostLists;

size_t ParamValues::elem_bytes() const { return dtype_size(compute_dtype_); }

const float* ParamValues::masters_f32(const chunk::ChunkState& c, uint64_t lo, uint64_t n,
                                      std::vector<float>& staging) const {
  if (master_format_ == optim::MasterFormat::kFp32) return c.master + lo;
  staging.resize(n);
  optim::masters_to_f32(master_format_, c.master, lo, n, staging.data());
  return staging.data();
}

chunk::ShardSpan ParamValues::shard_span(uint32_t id) const {
  const auto& place = layout_->param(id);
  return chunk::shard_span(place, (*parts_.chunks)[place.chunk].shard_elems, parts_.group->rank());
}

void ParamValues::read_device_masters(uint32_t k, uint64_t lo, uint64_t n, float* out) {
  const chunk::ChunkState& c = (*parts_.chunks)[k];
  if (master_format_ == optim::MasterFormat::kFp32) {
    parts_.hybrid->read_list(k, c.master + lo, out, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> bits(n);
  parts_.hybrid->read_list(k, reinterpret_cast<const uint16_t*>(c.master) + lo, bits.data(), n * sizeof(uint16_t));
  optim::masters_to_f32(master_format_, bits.data(), 0, n, out);
}

void ParamValues::write_device_masters(uint32_t k, uint64_t lo, uint64_t n, float* values) {
  chunk::ChunkState& c = (*parts_.chunks)[k];
  if (master_format_ == optim::MasterFormat::kFp32) {
    parts_.hybrid->write_list(k, c.master + lo, values, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> bits(n);
  optim::masters_from_f32(master_format_, bits.data(), 0, n, values);
  parts_.hybrid->write_list(k, reinterpret_cast<uint16_t*>(c.master) + lo, bits.data(), n * sizeof(uint16_t));
  optim::masters_to_f32(master_format_, bits.data(), 0, n, values);
}

void ParamValues::write(uint32_t id, const void* src, uint64_t count, pstar_dtype dtype) {
  if (parts_.group->sharded()) {
    write_sharded(id, src, dtype);
    return;
  }
  const auto& place = layout_->param(id);
  chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  if ((*parts_.params)[id].frozen()) {
    if (c.tier == Tier::kDevice) {
      std::vector<float> staging(count);
      convert_to_f32(src, dtype, staging.data(), count);
      write_slot_on_device(id, staging.data());
      return;
    }
    void* payload = parts_.placement->host_view(place.chunk);
    for (uint64_t i = 0; i < count; ++i) {
      store_as(payload, compute_dtype_, place.offset_elems + i, load_as(src, dtype, i));
    }
    return;
  }
  if (c.opt_device != nullptr) {
    // The master lives in device memory: staged through the host; the
    // weight is the master's value (staging holds it after the write).
    std::vector<float> staging(count);
    convert_to_f32(src, dtype, staging.data(), count);
    write_device_masters(place.chunk, place.offset_elems, count, staging.data());
    write_slot_on_device(id, staging.data());
    return;
  }
  parts_.nvme->access(place.chunk, true);
  optim::masters_from_dtype(master_format_, c.master, place.offset_elems, count, src, dtype);
  restore_slot(id);
}

void ParamValues::read(uint32_t id, void* dst, uint64_t count, pstar_dtype dtype) {
  if (parts_.group->sharded()) {
    read_sharded(id, dst, dtype);
    return;
  }
  const auto& place = layout_->param(id);
  const chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  if (!(*parts_.params)[id].frozen()) {
    parts_.nvme->access(place.chunk, false);
    std::vector<float> staging;
    const float* master = nullptr;
    if (c.opt_device != nullptr) {
      staging.resize(count);
      read_device_masters(place.chunk, place.offset_elems, count, staging.data());
      master = staging.data();
    } else {
      master = masters_f32(c, place.offset_elems, count, staging);
    }
    convert_from_f32(master, dst, dtype, count);
    return;
  }
  memory::Device* device = parts_.device;
  if (c.tier == Tier::kDevice) {
    // A copy of the slice, read where the chunk is.
    std::vector<unsigned char> staging(count * elem_bytes());
    device->stream_wait(device->compute_stream(), c.ready);
    device->copy_sync(staging.data(), static_cast<const char*>(c.device) + place.offset_elems * elem_bytes(),
                      staging.size(), memory::CopyKind::kDeviceToHost);
    for (uint64_t i = 0; i < count; ++i) store_as(dst, dtype, i, load_as(staging.data(), compute_dtype_, i));
    return;
  }
  const void* payload = parts_.placement->host_view(place.chunk);
  for (uint64_t i = 0; i < count; ++i) {
    store_as(dst, dtype, i, load_as(payload, compute_dtype_, place.offset_elems + i));
  }
}

void ParamValues::restore_slot(uint32_t id) {
  if (!payloads_) return;
  if (parts_.group->sharded()) {
    restore_slot_sharded(id);
    return;
  }
  const auto& place = layout_->param(id);
  chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  if (c.opt_device != nullptr) {
    std::vector<float> staging(place.numel);
    read_device_masters(place.chunk, place.offset_elems, place.numel, staging.data());
    write_slot_on_device(id, staging.data());
    return;
  }
  parts_.nvme->access(place.chunk, false);
  std::vector<float> staging;
  const float* master = masters_f32(c, place.offset_elems, place.numel, staging);
  if (c.tier == Tier::kDevice) {
    // Written where the chunk is (a skipped step keeps placement as it is).
    write_slot_on_device(id, master);
    return;
  }
  void* payload = parts_.placement->host_view(place.chunk);
  for (uint64_t i = 0; i < place.numel; ++i) store_as(payload, compute_dtype_, place.offset_elems + i, master[i]);
}

void ParamValues::write_slot_on_device(uint32_t id, const float* values) {
  const auto& place = layout_->param(id);
  const chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  std::vector<unsigned char> rounded(place.numel * elem_bytes());
  for (uint64_t i = 0; i < place.numel; ++i) store_as(rounded.data(), compute_dtype_, i, values[i]);
  memory::Device* device = parts_.device;
  parts_.placement->mark_written(place.chunk);
  memory::Stream* s = device->compute_stream();
  device->stream_wait(s, c.ready);
  device->stream_wait(s, c.last_use);
  device->copy_sync(static_cast<char*>(c.device) + place.offset_elems * elem_bytes(), rounded.data(), rounded.size(),
                    memory::CopyKind::kHostToDevice);
}

// Every rank passes the full values; each keeps its shard (no collective).
void ParamValues::write_sharded(uint32_t id, const void* src, pstar_dtype dtype) {
  const chunk::Param& p = (*parts_.params)[id];
  const auto& place = layout_->param(id);
  parts_.reduce->finish_through(place.chunk);
  if (!p.frozen()) parts_.nvme->access(place.chunk, true);  // the master shard may live on the drive
  chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  const auto [lo, a, b] = shard_span(id);
  HostLists lists(*parts_.hybrid, place.chunk, HostLists::kMaster);  // a master shard on the device
  // A compute shard on the device (hybrid placement) gets the parameter's
  // span, rounded here.
  const bool shard_on_device = parts_.hybrid->shard_on_device(place.chunk);
  std::vector<unsigned char> rounded(shard_on_device && a < b ? (b - a) * elem_bytes() : 0);
  for (uint64_t i = a; i < b; ++i) {
    float v = load_as(src, dtype, i - place.offset_elems);
    if (!p.frozen() && master_format_ == optim::MasterFormat::kBf16) {
      const uint16_t m = f32_to_bf16(v);  // the weight is the master's value
      reinterpret_cast<uint16_t*>(c.master)[i - lo] = m;
      v = bf16_to_f32(m);
    } else if (!p.frozen()) {
      c.master[i - lo] = v;
    }
    if (shard_on_device) {
      store_as(rounded.data(), compute_dtype_, i - a, v);
    } else {
      store_as(c.shard, compute_dtype_, i - lo, v);
    }
  }
  if (!p.frozen() && a < b) lists.write_back();
  if (!rounded.empty()) parts_.hybrid->write_shard(place.chunk, a - lo, rounded.data(), rounded.size());
}

// Collective: all-gathers the chunk's fp32 masters (a frozen parameter: its
// compute payload) and copies the parameter out.
void ParamValues::read_sharded(uint32_t id, void* dst, pstar_dtype dtype) {
  parts_.group->require_ok("param_read");
  const auto& place = layout_->param(id);
  const chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  constexpr auto kRead = distributed::CollectiveKind::kRead;
  if (!(*parts_.params)[id].frozen()) {
    parts_.nvme->access(place.chunk, false);
    const HostLists lists(*parts_.hybrid, place.chunk, HostLists::kMaster);
    std::vector<unsigned char> full(optim::master_list_bytes(master_format_, c.elems));
    parts_.group->all_gather_host("param_read: all-gather", kRead, place.chunk, c.master, full.data(),
                                  optim::master_list_bytes(master_format_, c.shard_elems));
    bytes_all_gathered_ += full.size();
    std::vector<float> staging;
    const float* values = reinterpret_cast<const float*>(full.data()) + place.offset_elems;
    if (master_format_ != optim::MasterFormat::kFp32) {
      staging.resize(place.numel);
      optim::masters_to_f32(master_format_, full.data(), place.offset_elems, place.numel, staging.data());
      values = staging.data();
    }
    convert_from_f32(values, dst, dtype, place.numel);
    return;
  }
  std::vector<unsigned char> full(c.bytes);
  parts_.group->all_gather_host("param_read: all-gather", kRead, place.chunk, c.shard, full.data(),
                                c.shard_elems * elem_bytes());
  bytes_all_gathered_ += c.bytes;
  for (uint64_t i = 0; i < place.numel; ++i) {
    store_as(dst, dtype, i, load_as(full.data(), compute_dtype_, place.offset_elems + i));
  }
}

// The weight back into this rank's part of the compute shard, from the
// master shard.
void ParamValues::restore_slot_sharded(uint32_t id) {
  const auto& place = layout_->param(id);
  parts_.nvme->access(place.chunk, false);
  chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  const auto [lo, a, b] = shard_span(id);
  if (parts_.hybrid->shard_on_device(place.chunk)) {
    // Both on the device (hybrid placement): the span's master in, the
    // rounded weights out.
    if (a >= b) return;
    std::vector<float> master(b - a);
    read_device_masters(place.chunk, a - lo, b - a, master.data());
    std::vector<unsigned char> rounded((b - a) * elem_bytes());
    for (uint64_t i = 0; i < b - a; ++i) store_as(rounded.data(), compute_dtype_, i, master[i]);
    parts_.hybrid->write_shard(place.chunk, a - lo, rounded.data(), rounded.size());
    return;
  }
  const HostLists lists(*parts_.hybrid, place.chunk, HostLists::kMaster);
  if (a >= b) return;
  std::vector<float> staging;
  const float* master = masters_f32(c, a - lo, b - a, staging);
  for (uint64_t i = a; i < b; ++i) store_as(c.shard, compute_dtype_, i - lo, master[i - a]);
}

}  // namespace pstar::values
