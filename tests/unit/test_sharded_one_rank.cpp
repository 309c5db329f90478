// The engine's sharded code paths with a group of one rank, on the emulated
// device in strict mode: once with a communicator that takes host memory (as
// Gloo) and once with one that takes device memory (as NCCL: gathers through
// the device buffer, gradients through a device staging buffer, host values
// through a device scratch buffer).  With exactly representable gradients
// the parameters must equal, bit for bit, those of the same steps without a
// group, at an unlimited and at a constrained capacity, also when the
// engine gathers ahead of use (two slots, the gathers on the collective
// queue's thread; the capacity grows by the slots).  The GPU twin of
// this test, over a real one-rank NCCL group, is tests/gpu/nccl_engine_check.
#include <criterion/criterion.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "distributed/comm/communicator.h"
#include "engine/engine.h"
#include "options.h"
#include "util/error.h"

using namespace pstar;

namespace {

// A group of one: every collective is a copy or nothing.
class OneRank final : public distributed::Communicator {
 public:
  explicit OneRank(bool device_buffers) : device_buffers_(device_buffers) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return device_buffers_ ? "one-rank (device buffers)" : "one-rank"; }
  bool failed() const override { return false; }
  bool device_buffers() const override { return device_buffers_; }
  void all_gather(const void* shard, void* out, size_t shard_bytes) override {
    ++calls;
    if (shard != out) std::memmove(out, shard, shard_bytes);
  }
  void reduce_scatter_sum(float* data, float* out, size_t block_elems) override {
    ++calls;
    std::memcpy(out, data, block_elems * sizeof(float));
  }
  void all_reduce_sum(double*, size_t) override { ++calls; }
  void all_reduce_max(int64_t*, size_t) override { ++calls; }
  void broadcast(void*, size_t, int) override { ++calls; }
  void barrier() override { ++calls; }
  static inline int calls = 0;

 private:
  bool device_buffers_;
};

constexpr int kParams = 5, kElems = 3000, kSteps = 5, kFrozen = 2;

std::vector<float> train(int group, uint64_t capacity, pstar_dtype dtype, pstar_stats* stats,
                         uint32_t ahead = 0, pstar_x_gather_stats* gather = nullptr) {
  pstar_engine_options o;
  pstar_engine_options_init(&o);
  o.device = PSTAR_DEVICE_EMULATED;
  o.strict = 1;
  o.strict_seed = 7;
  o.device_capacity_bytes = capacity;
  o.chunk_elems = 4096;
  o.compute_dtype = dtype;
  o.lr = 1e-2f;
  std::unique_ptr<distributed::Communicator> comm;
  if (group != 0) comm = std::make_unique<OneRank>(group == 2);
  engine::Engine e(pstar::capi::engine_options(o), std::move(comm));
  e.set_gather_ahead(ahead);
  std::vector<uint32_t> id(kParams);
  const int64_t shape[1] = {kElems};
  for (int p = 0; p < kParams; ++p) {
    const std::string name = "p" + std::to_string(p);
    id[p] = e.register_param(name.c_str(), 1, shape, p == kFrozen ? PSTAR_PARAM_FROZEN : 0);
  }
  e.build();
  std::vector<float> buf(kElems);
  for (int p = 0; p < kParams; ++p) {
    for (int i = 0; i < kElems; ++i) buf[i] = static_cast<float>((i * 7 + p * 13) % 101) / 128.0f - 0.375f;
    e.write(id[p], buf.data(), kElems, PSTAR_DTYPE_F32);
  }
  for (int s = 0; s < kSteps; ++s) {
    e.iteration_begin(PSTAR_ITERATION_TRAIN);
    for (int p = 0; p < kParams; ++p) {
      e.acquire(id[p], PSTAR_STAGE_FORWARD, nullptr);
      e.release(id[p], nullptr);
    }
    for (int p = kParams - 1; p >= 0; --p) {
      e.acquire(id[p], PSTAR_STAGE_BACKWARD, nullptr);
      if (p != kFrozen) {
        for (int i = 0; i < kElems; ++i) buf[i] = static_cast<float>(((i + s * 31 + p) % 17) - 8) / 64.0f;
        e.grad_write(id[p], buf.data(), kElems, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, nullptr);
      }
      e.release(id[p], nullptr);
    }
    e.step();
  }
  std::vector<float> out(static_cast<size_t>(kParams) * kElems);
  for (int p = 0; p < kParams; ++p) e.read(id[p], out.data() + static_cast<size_t>(p) * kElems, kElems, PSTAR_DTYPE_F32);
  pstar_stats_init(stats);
  e.fill_stats(stats);
  if (gather != nullptr) {
    pstar_x_gather_stats_init(gather);
    e.fill_gather_stats(gather);
  }
  return out;
}

void check(pstar_dtype dtype, uint64_t capacity) {
  pstar_stats plain_stats, host_stats, dev_stats;
  pstar_x_gather_stats host_gather, dev_gather;
  const std::vector<float> plain = train(0, capacity, dtype, &plain_stats);
  const std::vector<float> host = train(1, capacity, dtype, &host_stats, 0, &host_gather);
  const std::vector<float> dev = train(2, capacity, dtype, &dev_stats, 0, &dev_gather);
  cr_assert_eq(std::memcmp(plain.data(), host.data(), plain.size() * sizeof(float)), 0,
               "host-buffer group of one differs from no group (capacity %llu)", (unsigned long long)capacity);
  cr_assert_eq(std::memcmp(plain.data(), dev.data(), plain.size() * sizeof(float)), 0,
               "device-buffer group of one differs from no group (capacity %llu)", (unsigned long long)capacity);
  for (const pstar_stats* s : {&host_stats, &dev_stats}) {
    cr_assert_eq(s->world_size, 1);
    cr_assert_gt(s->bytes_all_gathered, 0u);
    cr_assert_gt(s->bytes_reduce_scattered, 0u);
    if (capacity != 0) {
      cr_assert_leq(s->peak_device_bytes, capacity, "peak %llu over %llu", (unsigned long long)s->peak_device_bytes,
                    (unsigned long long)capacity);
    }
  }
  cr_assert_eq(host_stats.collectives, dev_stats.collectives, "the same collectives whatever the buffers");
  // The copies around the collectives: each gather copies the rank's shard
  // (here the whole chunk) to the device; each reduce-scatter copies the sum's
  // block to the host (device buffers: one chunk of fp32 per reduction, what
  // bytes_reduce_scattered counts) or the gradient buffers to host staging
  // (host buffers: the trainable parameters' gradients, every step).
  const uint64_t chunk_bytes = 4096 * (dtype == PSTAR_DTYPE_F32 ? 4 : 2);
  for (const pstar_x_gather_stats* g : {&host_gather, &dev_gather}) {
    cr_assert_eq(g->bytes_shard_host_to_device % chunk_bytes, 0u);
    cr_assert_gt(g->bytes_shard_host_to_device, 0u);
    if (capacity == 0) {  // nothing evicted: every forward and backward use gathers
      cr_assert_eq(g->bytes_shard_host_to_device, uint64_t{kSteps} * 2 * kParams * chunk_bytes, "%llu",
                   (unsigned long long)g->bytes_shard_host_to_device);
    }
  }
  cr_assert_eq(dev_gather.bytes_reduce_device_to_host, dev_stats.bytes_reduce_scattered);
  cr_assert_eq(host_gather.bytes_reduce_device_to_host, uint64_t{kSteps} * (kParams - 1) * kElems * sizeof(float));
  // The device-buffer path stages gradients on the device: a higher peak.
  cr_assert_geq(dev_stats.peak_device_bytes, host_stats.peak_device_bytes);
  // Gathering ahead, two slots: the same bits, the same collectives.
  const uint64_t slots = 2 * 4096 * (dtype == PSTAR_DTYPE_F32 ? 4 : 2);
  for (int group = 1; group <= 2; ++group) {
    pstar_stats st;
    pstar_x_gather_stats g;
    const std::vector<float> ahead = train(group, capacity == 0 ? 0 : capacity + slots, dtype, &st, 2, &g);
    cr_assert_eq(std::memcmp(plain.data(), ahead.data(), plain.size() * sizeof(float)), 0,
                 "group %d gathering ahead differs from no group (capacity %llu)", group,
                 (unsigned long long)capacity);
    cr_assert_eq(st.collectives, host_stats.collectives);
    cr_assert_eq(g.slot_bytes, slots);
    // Steps 2-5 follow the schedule recorded at step 1: each gathers all
    // five chunks twice (forward, backward), in slots.
    cr_assert_eq(g.gathers_ahead, 4u * 2 * kParams, "group %d: %llu ahead", group,
                 (unsigned long long)g.gathers_ahead);
    cr_assert_eq(g.gathers_on_demand, 2u * kParams);
    cr_assert_eq(g.schedule_fallbacks, 0u);
  }
}

// Two bf16 chunks with their gradient buffers, and one reduce-scatter's
// device staging (a chunk and a shard of fp32).
constexpr uint64_t kTight = 2 * 4096 * 2 + 2 * kElems * 4 + 2 * 4096 * 4 + 4096 * 4;

}  // namespace

Test(sharded_one_rank, bf16_unlimited) { check(PSTAR_DTYPE_BF16, 0); }
Test(sharded_one_rank, bf16_constrained) { check(PSTAR_DTYPE_BF16, kTight); }
Test(sharded_one_rank, f16_constrained) { check(PSTAR_DTYPE_F16, kTight); }

Test(sharded_one_rank, a_cuda_engine_refuses_a_host_memory_group) {
  pstar_engine_options o;
  pstar_engine_options_init(&o);
  o.device = PSTAR_DEVICE_CUDA;
  bool refused = false;
  try {
    engine::Engine e(pstar::capi::engine_options(o), std::make_unique<OneRank>(false));
  } catch (const Error& err) {
    refused = err.status() == PSTAR_ERR_INVALID_ARGUMENT && std::string(err.what()).find("host memory") != std::string::npos;
  }
  cr_assert(refused, "a CUDA engine accepted a group that takes host memory");
}

// pstar_iteration_abort needs every rank to agree: refused with a group, in
// an iteration or not, and the refused call changes nothing (the iteration
// goes on to the same step as one that was never interrupted).
Test(sharded_one_rank, iteration_abort_is_refused_and_changes_nothing) {
  auto refused = [](engine::Engine& e) {
    try {
      e.iteration_abort();
    } catch (const Error& err) {
      return err.status() == PSTAR_ERR_UNSUPPORTED &&
             std::string(err.what()).find("every rank to agree") != std::string::npos &&
             std::string(err.what()).find("checkpoint") != std::string::npos;
    }
    return false;
  };
  std::vector<float> out[2];
  for (int interrupted = 0; interrupted < 2; ++interrupted) {
    pstar_engine_options o;
    pstar_engine_options_init(&o);
    o.device = PSTAR_DEVICE_EMULATED;
    o.chunk_elems = 4096;
    o.compute_dtype = PSTAR_DTYPE_BF16;
    o.lr = 1e-2f;
    engine::Engine e(pstar::capi::engine_options(o), std::make_unique<OneRank>(false));
    const int64_t shape[1] = {kElems};
    const uint32_t a = e.register_param("a", 1, shape, 0), b = e.register_param("b", 1, shape, 0);
    e.build();
    std::vector<float> buf(kElems);
    for (int i = 0; i < kElems; ++i) buf[i] = static_cast<float>(i % 29) / 32.0f - 0.4f;
    e.write(a, buf.data(), kElems, PSTAR_DTYPE_F32);
    e.write(b, buf.data(), kElems, PSTAR_DTYPE_F32);
    if (interrupted) cr_assert(refused(e), "abort without an iteration in a group");
    e.iteration_begin(PSTAR_ITERATION_TRAIN);
    for (uint32_t id : {a, b}) {
      e.acquire(id, PSTAR_STAGE_FORWARD, nullptr);
      e.release(id, nullptr);
    }
    for (uint32_t id : {b, a}) {
      e.acquire(id, PSTAR_STAGE_BACKWARD, nullptr);
      for (int i = 0; i < kElems; ++i) buf[i] = static_cast<float>((i + id) % 13) / 64.0f - 0.1f;
      e.grad_write(id, buf.data(), kElems, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, nullptr);
      if (interrupted) cr_assert(refused(e), "abort with a parameter acquired in a group");
      e.release(id, nullptr);
    }
    const pstar_step_result r = e.step();
    cr_assert_eq(r.step, 1u);
    cr_assert_eq(r.params_updated, 2u);
    out[interrupted].resize(2 * kElems);
    e.read(a, out[interrupted].data(), kElems, PSTAR_DTYPE_F32);
    e.read(b, out[interrupted].data() + kElems, kElems, PSTAR_DTYPE_F32);
  }
  cr_assert_eq(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0,
               "a refused abort changed the step");
}
