// GPU check of the engine sharded over NCCL, a plain C++ program (the GPU
// machine has no Criterion).  Exits 77 with "skipped: no CUDA device" where
// no GPU is usable.
//
// NCCL refuses two ranks on one GPU, so a machine with one GPU can run one
// rank only: the engine is given a one-rank NCCL group (the internal
// constructor that takes a group), which sends every chunk through the
// sharded code paths with device buffers (gathers: the shard copied to its
// block of the device buffer, then an in-place all-gather; gradients: laid
// out as the chunk in a device staging buffer, reduce-scattered, the block
// copied to the host; host values through a device scratch buffer).  With
// exactly representable gradients the parameters must equal, bit for bit,
// those of the same steps on the CUDA device without a group, at an
// unlimited and at a constrained capacity.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "distributed/comm/nccl_communicator.h"
#include "engine/engine.h"
#include "options.h"
#include "memory/cuda_device.h"
#include "util/error.h"

using namespace pstar;

namespace {

int passes = 0, failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
  } else {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

constexpr int kParams = 5;
constexpr int kElems = 3000;
constexpr int kSteps = 6;
constexpr int kFrozen = 2;

struct Run {
  std::vector<float> values;
  pstar_stats stats;
  pstar_x_gather_stats gather;
};

// `ahead`: gather-ahead depth (the all-gathers on the collective queue's
// thread, into device slots).
Run train(bool grouped, uint64_t capacity, pstar_dtype dtype, uint32_t ahead = 0) {
  pstar_engine_options o;
  pstar_engine_options_init(&o);
  o.device = PSTAR_DEVICE_CUDA;
  o.device_capacity_bytes = capacity;
  o.chunk_elems = 4096;
  o.compute_dtype = dtype;
  o.lr = 1e-2f;
  std::unique_ptr<distributed::Communicator> group;
  if (grouped) {
    distributed::NcclConfig nc;
    nc.rank = 0;
    nc.size = 1;
    nc.device = 0;
    group = distributed::make_nccl_communicator(nc, nullptr);
  }
  engine::Engine e(pstar::capi::engine_options(o), std::move(group));
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
        // Multiples of 1/64 in [-1/8, 1/8]: exact in bf16, f16 and sums.
        for (int i = 0; i < kElems; ++i) buf[i] = static_cast<float>(((i + s * 31 + p) % 17) - 8) / 64.0f;
        e.grad_write(id[p], buf.data(), kElems, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, nullptr);
      }
      e.release(id[p], nullptr);
    }
    e.step();
  }
  Run r;
  r.values.resize(static_cast<size_t>(kParams) * kElems);
  for (int p = 0; p < kParams; ++p) e.read(id[p], r.values.data() + static_cast<size_t>(p) * kElems, kElems, PSTAR_DTYPE_F32);
  pstar_stats_init(&r.stats);
  e.fill_stats(&r.stats);
  pstar_x_gather_stats_init(&r.gather);
  e.fill_gather_stats(&r.gather);
  return r;
}

}  // namespace

int main() {
  if (memory::cuda_runtime_device_count() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  // Room for two bf16 chunks and their gradient buffers, and the staging of
  // one reduce-scatter (a chunk and a shard of fp32): chunks are dropped and
  // gathered again.
  const uint64_t tight = 2 * 4096 * 2 + 2 * kElems * 4 + 2 * 4096 * 4 + 4096 * 4;
  for (pstar_dtype dtype : {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16}) {
    const char* dn = dtype == PSTAR_DTYPE_BF16 ? "bf16" : "f16";
    for (uint64_t cap : {uint64_t{0}, tight}) {
      const std::string tag = std::string(dn) + (cap == 0 ? ", unlimited" : ", constrained") + ": ";
      try {
        const Run plain = train(false, cap, dtype);
        const Run nccl = train(true, cap, dtype);
        expect(std::memcmp(plain.values.data(), nccl.values.data(), plain.values.size() * sizeof(float)) == 0,
               tag + "one-rank NCCL run bit-identical to the run without a group");
        expect(nccl.stats.world_size == 1 && nccl.stats.rank == 0, tag + "rank 0 of 1");
        expect(nccl.stats.bytes_all_gathered > 0 && nccl.stats.bytes_reduce_scattered > 0,
               tag + "chunks were gathered and gradients reduce-scattered");
        expect(nccl.stats.collectives >= static_cast<uint64_t>(kSteps) * (kParams + kParams - 1),
               tag + "collectives issued (" + std::to_string(nccl.stats.collectives) + ")");
        if (cap != 0) {
          expect(nccl.stats.peak_device_bytes <= cap, tag + "device peak within the capacity (" +
                                                          std::to_string(nccl.stats.peak_device_bytes) + " of " +
                                                          std::to_string(cap) + ")");
        }
        // Gathering ahead, two slots (the capacity grows by them).
        const uint64_t slots = 2 * 4096 * 2;
        const Run ahead = train(true, cap == 0 ? 0 : cap + slots, dtype, 2);
        expect(std::memcmp(plain.values.data(), ahead.values.data(), plain.values.size() * sizeof(float)) == 0,
               tag + "gathering ahead (depth 2) bit-identical to the run without a group");
        expect(ahead.stats.collectives == nccl.stats.collectives, tag + "the same collectives gathering ahead");
        expect(ahead.gather.gathers_ahead == static_cast<uint64_t>(kSteps - 1) * 2 * kParams,
               tag + "every gather after the recorded step ahead (" + std::to_string(ahead.gather.gathers_ahead) +
                   ")");
        std::printf("%sall-gathered %llu B, reduce-scattered %llu B, %llu collectives, device peak %llu B\n",
                    tag.c_str(), static_cast<unsigned long long>(nccl.stats.bytes_all_gathered),
                    static_cast<unsigned long long>(nccl.stats.bytes_reduce_scattered),
                    static_cast<unsigned long long>(nccl.stats.collectives),
                    static_cast<unsigned long long>(nccl.stats.peak_device_bytes));
      } catch (const std::exception& ex) {
        expect(false, tag + ex.what());
      }
    }
  }
  std::printf("nccl_engine_check: %d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
