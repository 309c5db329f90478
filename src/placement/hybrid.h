// HybridPlacement: hybrid optimizer placement (options.hybrid_optimizer).
// When warm-up ends, the peak of what the device had to hold whatever the
// chunk cache did (memory::DeviceTier::need: chunks in use, gradient
// buffers, non-model bytes) is known, as PatrickStar sizes its margin from
// the non-model peak; what the capacity leaves above it and a streaming
// reserve (the margin) takes the fp32 optimizer state
// (master, m, v, and the gradient list with accumulation) of as many
// trainable chunks as fit: chunks used last first, since they are the ones
// resident when the step runs.  The decision is made again at every TRAIN
// step from the need peak of the iterations since the previous one, so
// state moves back to the host when the need grows (a longer sequence, a
// larger batch) and onto the device when it shrinks; the moves are copies
// of the same bits, so results are those of hybrid placement off.  Such a
// chunk's compute payload stays on the device while its state is there
// (chunk::Chunk::opt_device makes it no victim), and its Adam update runs on
// the device, queued on the compute stream by the engine.
//
// With ZeRO sharding (world > 1) each rank places its own shards' state in
// its own margin, and decides alone (no collective: the ranks' capacities
// and needs may differ).  A shard's payload is not pinned (gathered chunks
// follow the gathering's rules), its gradient list stays on the host, and
// its device buffer holds, after the three lists, the shard's compute
// slot and, with accumulation, a staging region for its fp32 gradient.
// The compute slot is the shard's only copy while the state is there (the
// rank's compute shard points at it: HybridTable::compute_shard): the
// gradient goes in once its reduce-scatter is applied, Adam writes the
// weights there, and the rank's all-gathers copy it on the device, so the
// host holds no compute shard of a placed chunk and nothing is copied
// in and out at the step.  The buffer is then not the chunk's
// Chunk::opt_device (which pins a payload): placed() says where state is.
//
// What it owns: the decision (which chunks, in what order, within which
// margin), the move of the lists into one device buffer per chunk, that
// buffer (its size and the event after which it is valid), the count of
// TRAIN steps that ends warm-up, and the host's access to lists on the
// device (waits and copies).  It sees chunks through a HybridTable (the
// chunk's placement part and its fp32 lists) and the layout (which chunks
// are trainable), the elements of each chunk's lists (HybridTable::
// list_elems: a shard's with world > 1); it moves payloads and allocates
// through the placement runtime.  What it must not know: parameters,
// tensor states, the optimizer's arithmetic, the collectives, the NVMe tier
// (not combined with it).
//
// Threading: the engine's thread only, as the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "chunk/chunk.h"
#include "chunk/layout.h"
#include "memory/device.h"
#include "placement/runtime.h"
#include "pstar/pstar.h"

namespace pstar::placement {

// The chunks as hybrid placement sees them: the placement runtime's part and
// each chunk's fp32 lists.
class HybridTable : public ChunkTable {
 public:
  virtual chunk::Fp32Lists& lists_at(uint32_t k) = 0;
  // Elements of each of chunk k's fp32 lists (this rank's shard of them).
  virtual uint64_t list_elems(uint32_t k) const = 0;
  // world > 1: the pointer to this rank's compute shard of chunk k
  // (list_elems of the compute dtype), host memory unless hybrid placement
  // moved it into the chunk's device buffer; null with one process.
  virtual void** compute_shard(uint32_t k) = 0;

 protected:
  ~HybridTable() = default;
};

// Chunks' worth of device room kept free beside the need peak for the chunks
// that stream through (one being fetched while the next is prefetched), as
// the static policy's reserve.
constexpr uint64_t kStreamingChunks = 2;

struct HybridOptions {
  bool enabled = false;            // options.hybrid_optimizer
  uint32_t warmup_iterations = 1;  // TRAIN steps before the state is placed
  bool grad_accumulation = false;  // the gradient list moves too (one process)
  uint32_t elem_bytes = 2;         // the compute dtype's size (a shard's staging region)
  // Bytes of one of Adam's moment lists of n elements in the engine's state
  // format (optim::moment_list_bytes); null: fp32, 4n.
  std::function<uint64_t(uint64_t n)> moment_bytes;
  // Bytes of the master list of n elements (optim::master_list_bytes);
  // null: fp32, 4n.
  std::function<uint64_t(uint64_t n)> master_bytes;
};

class HybridPlacement {
 public:
  // The margin is the capacity less the device tier's need peak and the
  // streaming reserve (with world > 1, less the tier's resident peak where
  // that is more: gathered chunks kept between uses); the lists' copies
  // count as the runtime's host-to-device bytes.
  HybridPlacement(memory::Device* device, Runtime* runtime, const HybridOptions& options)
      : options_(options), device_(device), runtime_(runtime) {}

  // At build, before any other call that names a chunk.  `sharded`: world
  // > 1 (the lists are shards, the buffers hold the compute shard; see
  // above), known once the engine's group is connected.
  void attach(HybridTable* chunks, const chunk::ChunkLayout* layout, bool sharded = false);

  // The decision, re-made at every TRAIN step after warm-up: trainable
  // chunks, used last first, take their cost (their state and their pinned
  // payload) from the margin while it lasts, skipping those that do not
  // fit; a chunk with a pinned master stays where it is.  `out`: placed
  // chunks no longer chosen (the margin shrank: the need grew); `in`:
  // chosen chunks not yet placed.  A stable need gives the same choice, so
  // nothing moves.
  struct Plan {
    std::vector<uint32_t> out, in;
    uint64_t margin = 0;
    bool empty() const { return out.empty() && in.empty(); }
  };
  Plan plan() const;

  // A TRAIN step begins (its gradients are complete, its update not yet
  // run): once warm-up ends (the options' count of steps), moves what
  // `plan` (step_plan(), taken for this step) changes, then the need peak
  // starts again from there.  Before the update, so that a chunk placed now
  // is updated on the device at once and a chunk placed at the first step
  // never has Adam's moments on the host (chunk::Fp32Lists: they exist from
  // a chunk's first update); the host waits for the copies in, so that the
  // host lists they replace are back in the host pool before the update
  // takes buffers from it.  The engine takes the plan first so that it
  // stops a speculative update only when fp32 lists move.
  void step_begins(const Plan& plan);
  void step_begins() { step_begins(step_plan()); }
  // The decision for the step now beginning: empty before warm-up ends or
  // with hybrid placement off, plan() otherwise.
  Plan step_plan() const;

  // Bytes of chunk k's device buffer: its fp32 lists back to back (and the
  // staging region with world > 1).
  uint64_t state_bytes(uint32_t k) const;
  // Whether chunk k's optimizer state is on the device.
  bool placed(uint32_t k) const { return bytes_[k] != 0; }
  // world > 1, a placed chunk: the shard's compute slot in its buffer
  // (list_elems of the compute dtype; the compute shard itself) and, with
  // accumulation, the staging region of its fp32 gradient (null without).
  void* slot_staging(uint32_t k) const;
  float* grad_staging(uint32_t k) const;
  // world > 1: whether chunk k's compute shard is in its device buffer.
  bool shard_on_device(uint32_t k) const { return sharded_ && placed(k); }
  uint32_t chunks_on_device() const { return chunks_on_device_; }
  // Completes when chunk k's state is valid on the device (the copy from
  // the host); work queued on the device that reads it waits for it.
  const memory::EventPtr& state_ready(uint32_t k) const { return ready_[k]; }

  // Host access to the lists of a chunk whose state is on the device.
  // sync: the host waits until they may be read or written by host code
  // (emulated device) or copied (CUDA).  read_list and write_list copy
  // `bytes` between one of its lists (`on_device`, anywhere in it) and host
  // memory, after that wait.
  void sync(uint32_t k);
  void read_list(uint32_t k, const void* on_device, void* out, uint64_t bytes);
  void write_list(uint32_t k, void* on_device, const void* in, uint64_t bytes);
  // world > 1, a compute shard on the device: `bytes` from `in` into it at
  // element `offset_elems`, after that wait.
  void write_shard(uint32_t k, uint64_t offset_elems, const void* in, uint64_t bytes);
  // The step's read of its gradient list: waits for the chunk's queued work
  // on the compute stream only (the finalizes are queued there), then
  // copies.  A dry run copies too (its modelled time), into no memory.
  void read_gradient(uint32_t k, const float* on_device, float* out, uint64_t n);
  // Gradient accumulation: adds a parameter's device accumulator `acc` (n
  // floats) into the gradient list at `offset_elems`, queued on `stream`;
  // `acc` is freed (as a gradient buffer) once the addition is done.
  void fold_gradient(uint32_t k, memory::Stream* stream, uint64_t offset_elems, float* acc, uint64_t n);
  // The end of an iteration with gradient accumulation: every device
  // gradient list is cleared, queued on the compute stream.
  void clear_gradients();

  // The engine's destruction: frees chunk k's device buffer (nothing may
  // use it any more) and forgets its lists; false when it has none.
  bool release(uint32_t k);

  // Host code that reads or writes master, m and v of a chunk in place
  // (the sharded engine's values, checkpoints and skipped-step restore):
  // while a HostLists lives, the chosen lists (`which`: bits 1 master, 2
  // m, 4 v, 8 the compute shard with world > 1) of a placed chunk point at
  // host copies (read from the device at construction), and write_back()
  // copies them to the device.  For a chunk not placed it does nothing.  Slow paths, outside the training loop; the
  // host copies come from the host pool, which normally holds the host
  // lists the chunk's placement gave back.
  class HostLists {
   public:
    static constexpr unsigned kMaster = 1, kExpAvg = 2, kExpAvgSq = 4, kComputeShard = 8;
    static unsigned list_bit(int list) { return 1u << list; }  // 0 master, 1 m, 2 v, 3 the compute shard
    HostLists(HybridPlacement& hybrid, uint32_t k, unsigned which);
    ~HostLists();
    HostLists(const HostLists&) = delete;
    HostLists& operator=(const HostLists&) = delete;
    void write_back();

   private:
    void restore() noexcept;  // the device lists back, the host copies freed
    HybridPlacement& hybrid_;
    uint32_t k_;
    float* device_[3] = {nullptr, nullptr, nullptr};  // null: not placed
    void* device_shard_ = nullptr;                    // null: not chosen or not on the device
  };

 private:
  void move(uint32_t k);
  // The state of chunk k back to new host lists: the copies queued on the
  // D2H stream after the chunk's queued work, the host waiting for them
  // (the next host update reads the lists); the device buffer is freed
  // once they are done, and the payload becomes evictable again.
  void move_out(uint32_t k);
  uint64_t margin() const;
  // Lists that live in the device buffer: master, m, v, and the gradient
  // list with accumulation in one process.
  size_t device_lists() const { return options_.grad_accumulation && !sharded_ ? 4 : 3; }
  // Gives back to the host allocator the pool's cached buffers of the sizes
  // in `freed` that no host chunk's list still to be allocated has.
  void trim_unwanted(std::vector<uint64_t> freed);
  // The bytes of chunk k's list `i` (0 master, 1 m, 2 v, 3 the gradient
  // list): fp32 but Adam's moments, which are in the state format, and the
  // master, in the master format.
  uint64_t list_bytes(uint32_t k) const { return chunks_->list_elems(k) * sizeof(float); }
  uint64_t list_bytes(uint32_t k, size_t i) const {
    if ((i == 1 || i == 2) && options_.moment_bytes) return options_.moment_bytes(chunks_->list_elems(k));
    if (i == 0 && options_.master_bytes) return options_.master_bytes(chunks_->list_elems(k));
    return list_bytes(k);
  }
  // Where list `i` starts in chunk k's device buffer: the lists back to
  // back, each at a kListAlignBytes boundary (fp32 lists of whole
  // 128-element units end on one, so fp32 state keeps its layout), then
  // with world > 1 the compute shard.
  static constexpr uint64_t kListAlignBytes = 256;
  uint64_t list_offset(uint32_t k, size_t i) const {
    uint64_t at = 0;
    for (size_t j = 0; j < i; ++j) at += (list_bytes(k, j) + kListAlignBytes - 1) / kListAlignBytes * kListAlignBytes;
    return at;
  }
  float* list_at(uint32_t k, size_t i) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(base_[k]) + list_offset(k, i));
  }
  // world > 1: bytes of chunk k's compute shard (its slot in the buffer).
  uint64_t shard_bytes(uint32_t k) const { return chunks_->list_elems(k) * options_.elem_bytes; }

  const HybridOptions options_;
  memory::Device* device_;  // not owned
  Runtime* runtime_;        // not owned
  HybridTable* chunks_ = nullptr;
  const chunk::ChunkLayout* layout_ = nullptr;
  bool sharded_ = false;
  uint64_t train_steps_ = 0;  // TRAIN steps begun so far
  uint32_t chunks_on_device_ = 0;
  // Per chunk: its device buffer (null: none; one process: also the
  // chunk's opt_device), its size, and the event after which it is valid.
  std::vector<float*> base_;
  std::vector<uint64_t> bytes_;
  std::vector<memory::EventPtr> ready_;
};

}  // namespace pstar::placement
