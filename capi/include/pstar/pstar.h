/*
 * libpstar: chunk-based memory management for training models larger than
 * the accelerator's memory.  The one public header of the C ABI.
 *
 * Conventions (see docs/user-guide.md):
 *  - Every function returns a pstar_status: PSTAR_OK (0) or a negative error
 *    code whose value never changes between releases.  The detail of the
 *    last failure on the calling thread is in pstar_last_error_message().
 *  - Output parameters come last.  An output is written only on PSTAR_OK.
 *  - A failing call changes nothing, except where its documentation says.
 *  - Options and result structs begin with `size` and `version`; they grow
 *    by appending fields only.  Initialise them with the *_INIT macro or the
 *    *_init() function, then change the fields you need.  `size` is the
 *    caller's promise that `size` bytes are allocated there.  A struct is
 *    accepted when `version` is one the library knows (1 to its *_VERSION),
 *    `size` covers the fields of that version, `size` is at most
 *    PSTAR_STRUCT_SIZE_MAX, and every byte past the library's own struct
 *    (from its sizeof up to `size`) is zero: those bytes are read, never
 *    written.  Anything else is refused with PSTAR_ERR_VERSION before
 *    anything else happens.  Fields of later versions than the caller's
 *    keep their defaults; a result struct gets no more than `size` bytes.
 *  - Floating-point arguments and fields are checked as the library stores
 *    them: a double is rounded to float first (as pstar_hparam_set() does),
 *    and a value that rounding takes out of its range (a beta that rounds
 *    to 1, an epsilon that rounds to 0) is refused.  An accepted value reads
 *    back exactly as stored (pstar_hparam_get()).
 *  - An engine is driven by one thread at a time: a call on an engine while
 *    another call on the same engine is in progress (on another thread, or
 *    made from the log callback during it) returns PSTAR_ERR_BUSY, does
 *    nothing, and its message names both calls.  Handing an engine to
 *    another thread between calls is fine.  Its internal copy, optimizer
 *    and update threads (the overlapped step) never call back into the
 *    caller except through the log callback.  Functions marked "any thread" may be called from any thread
 *    at any time.
 *  - fork(): an engine belongs to the process that created it (its threads
 *    exist only there).  In a forked child every call on an engine of the
 *    parent returns PSTAR_ERR_INVALID_STATE at once, except
 *    pstar_engine_destroy(), which only forgets the handle (PSTAR_OK; no
 *    thread is joined and nothing is freed: the child's copy of the memory
 *    goes with the child).  The child may create engines of its own.  The
 *    parent's engines are unaffected.  A fork is seen through
 *    pthread_atfork(), so a child made without fork handlers (a raw clone(2),
 *    _Fork()) is not detected, except by pstar_engine_destroy().
 *
 * This header is C99; it compiles cleanly with
 * -std=c99 -Wall -Wextra -Wstrict-prototypes -pedantic -Werror.
 */
#ifndef PSTAR_PSTAR_H
#define PSTAR_PSTAR_H

#include <stddef.h>
#include <stdint.h>

#include "pstar/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PSTAR_API
#elif defined(__GNUC__)
#define PSTAR_API __attribute__((visibility("default")))
#else
#define PSTAR_API
#endif

/* ------------------------------------------------------------------------ */
/* Versions                                                                  */
/* ------------------------------------------------------------------------ */

/** Packs a version as 0xMMmmpp (major, minor, patch: one byte each). */
#define PSTAR_VERSION_PACK(major, minor, patch) \
  ((((uint32_t)(major)) << 16) | (((uint32_t)(minor)) << 8) | ((uint32_t)(patch)))

/** The version this header belongs to, packed by PSTAR_VERSION_PACK. */
#define PSTAR_VERSION_HEX \
  PSTAR_VERSION_PACK(PSTAR_VERSION_MAJOR, PSTAR_VERSION_MINOR, PSTAR_VERSION_PATCH)

/** Largest `size` the library accepts in a versioned struct (options and
 *  result structs; see the conventions at the top of this header). */
#define PSTAR_STRUCT_SIZE_MAX 4096

/** Runtime twin of PSTAR_VERSION_HEX: the version of the loaded library.
 *  Any thread. */
PSTAR_API uint32_t pstar_version(void);

/** The loaded library's version as "MAJOR.MINOR.PATCH" (static storage).
 *  Any thread. */
PSTAR_API const char *pstar_version_string(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/** Result of every call.  Values are pinned; new codes are only appended.
 *  Bindings must treat an unknown negative value as a generic error. */
typedef enum pstar_status {
  PSTAR_OK = 0,
  /** An argument is NULL, out of range, or inconsistent with another. */
  PSTAR_ERR_INVALID_ARGUMENT = -1,
  /** The engine handle is NULL, destroyed, or was never created. */
  PSTAR_ERR_INVALID_HANDLE = -2,
  /** The call is not legal in the current state (wrong order, a parameter
   *  in the wrong tensor state, a gradient for a frozen parameter...). */
  PSTAR_ERR_INVALID_STATE = -3,
  /** A parameter id, name or other key does not exist. */
  PSTAR_ERR_NOT_FOUND = -4,
  /** What must be resident now does not fit in a tier's capacity.  The
   *  message names the tier, the request and the free bytes.  The engine
   *  remains usable. */
  PSTAR_ERR_OUT_OF_MEMORY = -5,
  /** A chunk is pinned by an outstanding export; retry after releasing it.
   *  Also: another call on the same engine is in progress (an engine is
   *  driven by one thread at a time); nothing was done. */
  PSTAR_ERR_BUSY = -6,
  /** The feature is not available in this build or on this machine. */
  PSTAR_ERR_UNSUPPORTED = -7,
  /** An accelerator runtime call failed. */
  PSTAR_ERR_DEVICE = -8,
  /** A file or disk operation failed. */
  PSTAR_ERR_IO = -9,
  /** A collective or the rendezvous failed; the engine refuses further steps. */
  PSTAR_ERR_COMM = -10,
  /** An options or result struct has a size or version this library does not
   *  know (built against a newer header). */
  PSTAR_ERR_VERSION = -11,
  /** An invariant of the library was violated: a bug; please report it. */
  PSTAR_ERR_INTERNAL = -12,
  PSTAR_STATUS_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_status;

/** Symbolic name of a status ("PSTAR_ERR_BUSY"); "PSTAR_ERR_UNKNOWN" for a
 *  value this library does not know.  Static storage.  Any thread. */
PSTAR_API const char *pstar_status_name(pstar_status status);

/** One-sentence description of a status.  Static storage.  Any thread. */
PSTAR_API const char *pstar_status_string(pstar_status status);

/** Detail of the last failing call on this thread; "" if none has failed.
 *  Never NULL.  Valid until the next libpstar call on the same thread.
 *  Any thread (the message is per thread). */
PSTAR_API const char *pstar_last_error_message(void);

/* ------------------------------------------------------------------------ */
/* Enumerations                                                              */
/* ------------------------------------------------------------------------ */

/* Every enum ends with a *_FORCE_32BIT_ member (INT32_MIN) that is not a
 * value: it fixes the enum's size at 32 bits in every compiler (part of the
 * ABI) and makes every int a representable value of the enum in C++, so the
 * library rejects an unknown value with PSTAR_ERR_INVALID_ARGUMENT instead of
 * meeting undefined behaviour. */

/** Element types. */
typedef enum pstar_dtype {
  PSTAR_DTYPE_F32 = 0,
  PSTAR_DTYPE_F16 = 1,
  PSTAR_DTYPE_BF16 = 2,
  PSTAR_DTYPE_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_dtype;

/** The accelerator tier. */
typedef enum pstar_device_kind {
  /** Host memory posing as an accelerator with a fixed capacity. */
  PSTAR_DEVICE_EMULATED = 0,
  /** A CUDA device (builds with CUDA only). */
  PSTAR_DEVICE_CUDA = 1,
  PSTAR_DEVICE_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_device_kind;

/** Stage of an acquire. */
typedef enum pstar_stage {
  PSTAR_STAGE_FORWARD = 0,
  PSTAR_STAGE_BACKWARD = 1,
  /** Forward re-run inside backward (activation checkpointing): does not
   *  count as a forward use. */
  PSTAR_STAGE_RECOMPUTE = 2,
  PSTAR_STAGE_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_stage;

/** Kind of iteration. */
typedef enum pstar_iteration_kind {
  /** Forward and backward micro-steps ended by pstar_step(). */
  PSTAR_ITERATION_TRAIN = 0,
  /** Forward only, ended by pstar_iteration_end(); no gradients, no step. */
  PSTAR_ITERATION_EVAL = 1,
  PSTAR_ITERATION_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_iteration_kind;

/** Where a buffer handed to the library lives. */
typedef enum pstar_mem_space {
  PSTAR_MEM_HOST = 0,
  /** Accelerator memory (on the emulated device: memory it returned, i.e.
   *  inside a buffer from pstar_param_acquire() or
   *  pstar_grad_slot_acquire()).  The emulated device in strict mode
   *  checks both spaces (see pstar_grad_write()). */
  PSTAR_MEM_DEVICE = 1,
  PSTAR_MEM_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_mem_space;

/** Parameter flags for pstar_param_register(), combined with `|`. */
typedef enum pstar_param_flags {
  PSTAR_PARAM_DEFAULT = 0,
  /** Not trained: kept only in the compute dtype, no gradient, no Adam state. */
  PSTAR_PARAM_FROZEN = 1u << 0,
  /** Excluded from weight decay (biases, norms). */
  PSTAR_PARAM_NO_WEIGHT_DECAY = 1u << 1,
  PSTAR_PARAM_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_param_flags;

/** The format of Adam's moments (m and v) in every tier
 *  (pstar_engine_options.state_format; docs/design.md, "Optimizer state
 *  formats").  The fp32 masters are the same in every format. */
typedef enum pstar_state_format {
  /** fp32 m and v: 4 bytes each per element (the default). */
  PSTAR_STATE_FP32 = 0,
  /** bf16 m and v (rounded to nearest even after each update): 2 bytes
   *  each per element. */
  PSTAR_STATE_BF16 = 1,
  /** Blockwise 8-bit m and v (Dettmers et al., ICLR 2022): a code byte each
   *  per element on the dynamic map (signed for m, unsigned for v) and an
   *  fp32 absolute maximum per block of PSTAR_STATE_INT8_BLOCK elements of
   *  a parameter. */
  PSTAR_STATE_INT8 = 2,
  PSTAR_STATE_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_state_format;

/** Elements per block of PSTAR_STATE_INT8 (one absolute maximum each);
 *  each parameter's blocks start at its first element. */
#define PSTAR_STATE_INT8_BLOCK 256

/** The format of the master weights (pstar_engine_options.master_format;
 *  docs/design.md, "Optimizer state formats"). */
typedef enum pstar_master_format {
  /** fp32 masters: 4 bytes per element (the default). */
  PSTAR_MASTER_FP32 = 0,
  /** bf16 masters: 2 bytes per element.  Each update computes the new
   *  master in fp32 and rounds it to bf16 stochastically, with random bits
   *  that are a function of master_seed, the step count and the element's
   *  place in its parameter: reruns, placements and rank counts give the same
   *  bits.  pstar_param_read and pstar_param_write still speak fp32 (a
   *  write rounds to nearest even). */
  PSTAR_MASTER_BF16 = 1,
  PSTAR_MASTER_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_master_format;

/** Eviction policy of the accelerator tier. */
typedef enum pstar_policy {
  /** Belady's OPT from the warm-up trace: evict the chunk used furthest in
   *  the future; LRU during warm-up and after the access order diverges
   *  from the trace (which is then recorded anew). */
  PSTAR_POLICY_OPT = 0,
  /** Least recently used. */
  PSTAR_POLICY_LRU = 1,
  /** Static (ZeRO-Offload style): the first chunks, in layout order, that
   *  fit the capacity less a streaming reserve (two of the largest chunks
   *  and two of the largest gradient buffers) stay on the accelerator once
   *  fetched; the other chunks stream through the reserve, LRU among them.
   *  A resident chunk is evicted only when non-model memory leaves no room
   *  in the reserve. */
  PSTAR_POLICY_STATIC = 2,
  PSTAR_POLICY_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_policy;

/** Log levels, most verbose first. */
typedef enum pstar_log_level {
  PSTAR_LOG_DEBUG = 0,
  PSTAR_LOG_INFO = 1,
  PSTAR_LOG_WARN = 2,
  PSTAR_LOG_ERROR = 3,
  PSTAR_LOG_OFF = 4,
  PSTAR_LOG_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_log_level;

/* ------------------------------------------------------------------------ */
/* Logging and memory                                                        */
/* ------------------------------------------------------------------------ */

/** Receives one log record.  May be called from the library's internal
 *  threads, concurrently: bindings must take their interpreter lock or attach
 *  the thread.  `message` is valid only during the call.  It may be called
 *  during a call on an engine: a call on that engine from the callback is
 *  refused with PSTAR_ERR_BUSY (functions marked "any thread" and calls on
 *  other engines are fine).  Records the library would emit on the same
 *  thread while the callback runs (e.g. the failure of a call it makes)
 *  are dropped, so a callback that calls the library cannot recurse. */
typedef void (*pstar_log_fn)(pstar_log_level level, const char *message, void *user);

/** Sets the process-wide log callback (NULL restores the default: stderr) and
 *  the minimum level passed to it.  The initial level comes from the
 *  environment variable PSTAR_LOG_LEVEL (debug, info, warn, error, off;
 *  default warn).  Any thread. */
PSTAR_API pstar_status pstar_log_set_callback(pstar_log_fn fn, void *user,
                                              pstar_log_level min_level);

/** Frees memory that the library allocated for the caller.  NULL is a no-op.
 *  Any thread. */
PSTAR_API void pstar_free(void *ptr);

/* ------------------------------------------------------------------------ */
/* Engine options                                                            */
/* ------------------------------------------------------------------------ */

/** Current version of pstar_engine_options. */
#define PSTAR_ENGINE_OPTIONS_VERSION 6

/** Options for pstar_engine_create().  A field means what it says (a weight
 *  decay of zero is zero); only sizes and counts use 0 for "choose for me". */
typedef struct pstar_engine_options {
  /** sizeof(pstar_engine_options) as the caller compiled it. */
  uint32_t size;
  /** PSTAR_ENGINE_OPTIONS_VERSION as the caller compiled it. */
  uint32_t version;

  /* Placement */
  /** The accelerator tier: PSTAR_DEVICE_EMULATED (default) or
   *  PSTAR_DEVICE_CUDA. */
  pstar_device_kind device;
  /** CUDA device ordinal (ignored by the emulated device). */
  int32_t device_ordinal;
  /** Bytes of accelerator memory the engine may use for chunks and gradient
   *  buffers; 0 = unlimited on the emulated device, all free memory on CUDA. */
  uint64_t device_capacity_bytes;
  /** Bytes of host memory the engine may use; 0 = unlimited.  With a
   *  capacity, pstar_engine_build() allocates every fp32 list (Adam's m
   *  and v too, which an unlimited host gets at each chunk's first update),
   *  so that a capacity too small fails there. */
  uint64_t host_capacity_bytes;
  /** Elements per chunk; 0 = default (PSTAR_DEFAULT_CHUNK_ELEMS);
   *  PSTAR_CHUNK_ELEMS_AUTO = sized to the registered parameters by
   *  pstar_engine_build() (the stats' fill_ratio and compute_chunks show
   *  the outcome; a checkpoint's manifest records the size). */
  uint64_t chunk_elems;
  /** Worker threads for the CPU optimizer; 0 = one per core. */
  uint32_t threads;
  /** Emulated device only: strict mode (poison-filled copy destinations,
   *  seeded random delays on its streams, every access checked against the
   *  event guarding it).  Slow; for tests. */
  int32_t strict;
  /** Seed of the strict mode's delays. */
  uint64_t strict_seed;

  /* Numerics */
  /** Dtype of the parameters handed to the caller: F16, BF16 or F32. */
  pstar_dtype compute_dtype;

  /* Optimizer (ranges: see pstar_hparam_set(); NaN and infinities are
   * refused everywhere) */
  float lr;           /**< Adam's learning rate, in [0, 1e30] (default 1e-3). */
  float beta1;        /**< Adam's first-moment decay, in [0, 1) (default 0.9). */
  float beta2;        /**< Adam's second-moment decay, in [0, 1) (default 0.999). */
  float eps;          /**< Adam's epsilon, in [FLT_MIN, 1e30] (default 1e-8). */
  float weight_decay; /**< Weight decay, in [0, 1e30] (default 0.01; see adamw). */
  /** Nonzero: decoupled weight decay (AdamW); zero: L2 added to the gradient. */
  int32_t adamw;
  /** Global gradient-norm clipping threshold, in [0, 1e30]; 0 disables
   *  clipping. */
  float clip_norm;

  /* Dynamic loss scaling (F16 only; BF16 and F32 use a fixed scale of 1) */
  /** Scale of the first iteration, in [FLT_MIN, FLT_MAX] (default 65536). */
  float loss_scale_initial;
  float loss_scale_growth_factor;      /**< Multiplies the scale after growth_interval clean steps (in [1, 1e30]; 1 never grows it). */
  float loss_scale_backoff_factor;     /**< Multiplies the scale after an overflow (in (0, 1]; 1 never backs off). */
  uint32_t loss_scale_growth_interval; /**< Clean steps before the scale grows (default 2000). */
  uint32_t loss_scale_hysteresis;      /**< Overflows tolerated before backing off (default 2). */
  /** Floor of the scale, in [FLT_MIN, FLT_MAX] (default 1).  The scale never
   *  grows past FLT_MAX. */
  float loss_scale_min;

  /* Version 2 */
  /** Nonzero: keep a separate fp32 gradient list (18 bytes per trainable
   *  parameter instead of 14), so gradients accumulate over micro-batches:
   *  several forward/backward passes per TRAIN iteration before pstar_step().
   *  Zero: a parameter's gradient replaces its weight in the compute-dtype
   *  slot after its backward, so one forward/backward pass per iteration. */
  int32_t grad_accumulation;

  /* Version 3 */
  /** Eviction policy of the accelerator tier. */
  pstar_policy placement_policy;
  /** TRAIN iterations recorded before the trace guides placement; 0 = 1. */
  uint32_t warmup_iterations;
  /** Nonzero (the default): with PSTAR_POLICY_OPT, copy the chunks of the
   *  next moments of the trace to the accelerator ahead of their use,
   *  asynchronously, into room that their use will not take from a chunk
   *  needed sooner.  Zero: fetch on demand only. */
  int32_t prefetch;

  /* Version 4 */
  /** Emulated device only.  Nonzero: the device runs on a modelled clock
   *  instead of wall time, so that overlap and waiting figures do not depend
   *  on the machine: queued work runs at once, in queue order, on the calling
   *  thread; a copy occupies its stream for bytes / bandwidth modelled
   *  seconds; the caller's compute advances the clock through
   *  pstar_clock_advance().  Strict mode needs the wall clock. */
  int32_t virtual_clock;
  /** Nonzero: dry run (implies virtual_clock): the same placement runtime
   *  with no payloads.  Nothing is allocated for chunks, copies move no
   *  bytes, the optimizer computes nothing; bytes moved, moves, evictions,
   *  per-tier peaks and the modelled clock are counted as in a run with
   *  payloads.  pstar_param_acquire() yields NULL, pstar_grad_write() takes
   *  a NULL gradient, pstar_param_write()/read() and
   *  pstar_grad_slot_acquire() return PSTAR_ERR_UNSUPPORTED. */
  int32_t dry_run;
  /** Modelled host-to-accelerator bandwidth of the virtual clock, bytes
   *  per second, in [1, 1e18]; 0 = PSTAR_DEFAULT_LINK_BYTES_PER_S. */
  double h2d_bytes_per_s;
  /** Modelled accelerator-to-host bandwidth, as h2d_bytes_per_s. */
  double d2h_bytes_per_s;
  /** Bytes of the accelerator tier the engine leaves unused: chunks,
   *  gradient buffers and reported non-model bytes are kept within
   *  device_capacity_bytes minus this margin (headroom for allocations the
   *  caller does not report).  Must be below a nonzero capacity. */
  uint64_t device_margin_bytes;
  /** Nonzero: keep a timeline of moves and per-moment memory for
   *  pstar_trace_export() (grows with every moment; for analysis runs). */
  int32_t record_timeline;
  /** Hybrid optimizer placement.  Zero (the default): the fp32 optimizer
   *  state of every trainable chunk (master, Adam m and v: 12 bytes per
   *  element, 16 with grad_accumulation) lives on the host and pstar_step()
   *  updates it on the CPU.  Nonzero: at the step that ends warm-up, and
   *  again at every TRAIN step after it, before the update, the engine
   *  chooses the trainable
   *  chunks whose optimizer state fits in the margin (device_capacity_bytes
   *  - device_margin_bytes - the peak since the previous choice of what the
   *  accelerator had to hold whatever it cached: parameters in use, gradient
   *  buffers, non-model bytes - two of the largest chunk for streaming),
   *  chunks used last in backward first, and moves state onto the
   *  accelerator or back to the host to match; cached chunks give way to
   *  it.  Their parameter chunks stay on the accelerator while their state
   *  is there, and pstar_step() updates them there while the CPU updates
   *  the others.  Adam's m and v of a chunk exist from its first update
   *  (without a host capacity or NVMe tier), so a chunk placed at the
   *  first step never has them on the host: through warm-up the host holds
   *  the compute payloads and the masters.  State moves only at steps: a
   *  non-model report
   *  within an iteration larger than any before may fail with
   *  PSTAR_ERR_OUT_OF_MEMORY where hybrid off would evict.
   *  Results are bit-identical either way.  A zero capacity (unlimited, on
   *  the emulated device) places every chunk; on CUDA it is rejected.
   *  With world_size > 1 each rank places its own shards' state in its own
   *  margin, above the larger of that peak with the reserve and what its
   *  accelerator held beside placed state (gathered chunks kept between
   *  uses); its shard's payload is not pinned, and the shard's compute
   *  slot moves to the accelerator with the state, its only copy there:
   *  the all-gathers copy it on the accelerator (docs/distributed.md). */
  int32_t hybrid_optimizer;
  /* Data parallelism (ZeRO-3 sharding; docs/distributed.md) */
  /** This process's rank, 0..world_size-1; read only when world_size > 0
   *  (it must be 0 when world_size is 0). */
  int32_t rank;
  /** Number of data-parallel ranks training this model together, each
   *  holding 1/world_size of every chunk.  0 (the default): taken from the
   *  launcher's environment (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*;
   *  docs/launching.md), a single process when none is set.  1: this
   *  process alone, whatever the environment.  With more than one rank the
   *  rendezvous address comes from MASTER_ADDR and MASTER_PORT, rank 0
   *  serves the rendezvous store on MASTER_PORT (under torchrun every rank
   *  joins the store torchrun serves there instead), and every rank must make
   *  the same calls in the same order (registration, acquires and releases,
   *  pstar_param_read, pstar_step).  Emulated device only for now (CUDA
   *  ranks: PSTAR_ERR_UNSUPPORTED). */
  int32_t world_size;
  /** Milliseconds the rendezvous and each collective wait for the other
   *  ranks before failing with PSTAR_ERR_COMM; 0 = 60000. */
  uint32_t comm_timeout_ms;
  /* Version 5 */
  /** The format of Adam's m and v (pstar_state_format; default
   *  PSTAR_STATE_FP32, today's bits).  Fixed for the engine's life, and
   *  part of its checkpoints: a load into an engine of another format is
   *  refused.  With PSTAR_STATE_INT8 every parameter starts on a block
   *  boundary (chunk_elems must then be a multiple of
   *  PSTAR_STATE_INT8_BLOCK).  The NVMe tier and hybrid_optimizer store
   *  the moments in the format too (on CUDA, the formats' kernels are
   *  compiled and checked by tests/gpu/run.sh, but have not yet run on a
   *  GPU). */
  pstar_state_format state_format;
  /* Version 6 */
  /** The format of the master weights (pstar_master_format; default
   *  PSTAR_MASTER_FP32).  Fixed for the engine's life and part of its
   *  checkpoints, as state_format.  The NVMe tier and hybrid_optimizer
   *  store the masters' 2 bytes (on CUDA through a kernel not yet run on a
   *  GPU); pstar_param_pin is refused (PSTAR_ERR_UNSUPPORTED). */
  pstar_master_format master_format;
  /** The seed of PSTAR_MASTER_BF16's stochastic rounding (any value; the
   *  same seed gives the same bits). */
  uint64_t master_seed;
} pstar_engine_options;

/** Default modelled bandwidth of a host<->accelerator link: 12 GB/s, what a
 *  PCIe 3.0 x16 link delivers from pinned memory. */
#define PSTAR_DEFAULT_LINK_BYTES_PER_S 12e9

/** Default elements per chunk. */
#define PSTAR_DEFAULT_CHUNK_ELEMS (1u << 22)

/** chunk_elems that asks pstar_engine_build() for the size of least
 *  padding for the registered parameters: among the sizes from a quarter
 *  of PSTAR_DEFAULT_CHUNK_ELEMS to PSTAR_DEFAULT_CHUNK_ELEMS (or the
 *  largest parameter, where it is larger), the one whose chunks hold the
 *  fewest unused elements; on a tie within 0.5%, the smallest.  It
 *  depends on the parameters' sizes, order and flags and the state format
 *  alone, so every rank computes the same.  (Not a multiple of 128, so
 *  never a size itself.) */
#define PSTAR_CHUNK_ELEMS_AUTO 1

/** The library's defaults, as an initializer. */
#define PSTAR_ENGINE_OPTIONS_INIT                                                   \
  {                                                                                 \
    sizeof(pstar_engine_options), PSTAR_ENGINE_OPTIONS_VERSION, PSTAR_DEVICE_EMULATED, \
        0, 0, 0, 0, 0, 0, 0, PSTAR_DTYPE_BF16, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1,    \
        0.0f, 65536.0f, 2.0f, 0.5f, 2000u, 2u, 1.0f, 0, PSTAR_POLICY_OPT, 0, 1, 0, 0,  \
        0.0, 0.0, 0, 0, 0, 0, 0, 0, PSTAR_STATE_FP32, PSTAR_MASTER_FP32, 0            \
  }

/** Writes the library's defaults into *options (the same as
 *  PSTAR_ENGINE_OPTIONS_INIT, for bindings that drop macros).  Any thread. */
PSTAR_API pstar_status pstar_engine_options_init(pstar_engine_options *options);

/* ------------------------------------------------------------------------ */
/* Engine                                                                    */
/* ------------------------------------------------------------------------ */

/** An engine: one model's chunks, placement and optimizer.  Opaque. */
typedef struct pstar_engine pstar_engine;

/** Creates an engine.  Live engines are kept in a process-wide registry, so
 *  a call on a destroyed engine returns PSTAR_ERR_INVALID_HANDLE (limit: a
 *  new engine may reuse a destroyed one's address). */
PSTAR_API pstar_status pstar_engine_create(const pstar_engine_options *options,
                                           pstar_engine **out_engine);

/** Destroys an engine and frees its memory.  NULL is a no-op (PSTAR_OK).
 *  PSTAR_ERR_BUSY (nothing done) while another call on the engine is in
 *  progress; a call that races with the end of a destroy may see freed
 *  memory, as with any handle used after its destroy.  In a forked child,
 *  for an engine of the parent: forgets the handle only (see the
 *  conventions at the top). */
PSTAR_API pstar_status pstar_engine_destroy(pstar_engine *engine);

/** Registers a parameter, in the order the model first uses it.  `shape` has
 *  `ndim` extents (ndim 0 is a scalar); `name` must be unique and non-empty.
 *  Legal before pstar_engine_build() only. */
PSTAR_API pstar_status pstar_param_register(pstar_engine *engine, const char *name,
                                            uint32_t ndim, const int64_t *shape,
                                            uint32_t flags, uint32_t *out_id);

/** Freezes the layout and allocates the chunks (zero-filled).  Legal once. */
PSTAR_API pstar_status pstar_engine_build(pstar_engine *engine);

/** Looks up a parameter id by name. */
PSTAR_API pstar_status pstar_param_find(pstar_engine *engine, const char *name,
                                        uint32_t *out_id);

/** Number of registered parameters. */
PSTAR_API pstar_status pstar_param_count(pstar_engine *engine, uint32_t *out_count);

/** Element count of a parameter. */
PSTAR_API pstar_status pstar_param_numel(pstar_engine *engine, uint32_t id,
                                         uint64_t *out_numel);

/** Parameter groups: multiplies the learning rate for parameter `id` by
 *  `lr_scale` (in [0, 1e30]; 1 by default; 0 keeps it fixed unless weight
 *  decay applies).  Takes effect at the next step.  Legal after registration,
 *  outside TRAIN iterations. */
PSTAR_API pstar_status pstar_param_set_lr_scale(pstar_engine *engine, uint32_t id, float lr_scale);

/** Parameter groups: includes (nonzero) or excludes (zero) parameter `id`
 *  from weight decay; the initial value comes from PSTAR_PARAM_NO_WEIGHT_DECAY.
 *  Same legality as pstar_param_set_lr_scale(). */
PSTAR_API pstar_status pstar_param_set_weight_decay(pstar_engine *engine, uint32_t id, int32_t enabled);

/** Sets a parameter's values from `count` (= its element count) elements of
 *  `dtype` in host memory.  A trainable parameter's fp32 master takes the
 *  values and its compute copy takes them rounded to the compute dtype.
 *  Legal after build and outside iterations.  With world_size > 1 every
 *  rank passes the same full values and keeps its shard of them (no
 *  communication). */
PSTAR_API pstar_status pstar_param_write(pstar_engine *engine, uint32_t id, const void *src,
                                         uint64_t count, pstar_dtype dtype);

/** Copies a parameter's values into `count` elements of `dtype` in host
 *  memory: the fp32 master of a trainable parameter, the compute copy of a
 *  frozen one.  Never returns a gradient.  Legal after build, outside iterations.
 *  With world_size > 1 it is a collective (an all-gather of the chunk's
 *  shards): every rank must call it for the same parameters in the same
 *  order, and every rank receives the full values. */
PSTAR_API pstar_status pstar_param_read(pstar_engine *engine, uint32_t id, void *dst,
                                        uint64_t count, pstar_dtype dtype);

/** Exports parameter `id`'s fp32 master values without a copy: *out_ptr
 *  points to its numel floats in host memory, valid until
 *  pstar_param_unpin(); *out_dtype is PSTAR_DTYPE_F32.  Read-only unless
 *  `writable` is nonzero; a writable pin is legal only outside iterations,
 *  no iteration may begin while one is held, and its unpin copies the master
 *  (rounded) into the compute copy, wherever that is.  While a parameter is
 *  pinned, a pstar_step() that would update it returns PSTAR_ERR_BUSY
 *  (nothing is changed; unpin and call it again), and hybrid placement never
 *  moves its state.  Pins nest (one unpin per pin).  PSTAR_ERR_UNSUPPORTED
 *  for a frozen parameter (it has no master; use pstar_param_read), in a dry
 *  run, with world_size > 1 (a rank holds only its shard), and for state
 *  placed on the accelerator by hybrid placement. */
PSTAR_API pstar_status pstar_param_pin(pstar_engine *engine, uint32_t id, int32_t writable,
                                       void **out_ptr, pstar_dtype *out_dtype);

/** Ends the latest pin of parameter `id` (PSTAR_ERR_INVALID_STATE if it has
 *  none); the end of a writable pin refreshes the compute copy. */
PSTAR_API pstar_status pstar_param_unpin(pstar_engine *engine, uint32_t id);

/* ------------------------------------------------------------------------ */
/* Checkpoints                                                               */
/* ------------------------------------------------------------------------ */

/** Saves the engine's training state into directory `dir` (created if
 *  missing): every parameter's fp32 master, Adam's m and v, frozen values,
 *  Adam's step, the loss scaler and the hyperparameters, each file with an
 *  XXH3 checksum, in a new subdirectory that `dir/LATEST` then names
 *  (replaced atomically: a crash or a full disk at any point leaves the
 *  previous checkpoint loadable).  Legal after the build, between
 *  iterations.  With world_size > 1 it is a collective: every rank writes
 *  its shards, rank 0 the manifest and LATEST, into a directory every rank
 *  reaches; all ranks return the same status.  PSTAR_ERR_IO names the file
 *  and the cause; PSTAR_ERR_UNSUPPORTED in a dry run or in a build without
 *  xxhash.  Format: docs/checkpoints.md. */
PSTAR_API pstar_status pstar_checkpoint_save(pstar_engine *engine, const char *dir);

/** Loads the checkpoint `dir/LATEST` names into this engine, which must
 *  register the same parameters (names, shapes, frozen or not; order and
 *  chunk size may differ).  Everything is verified before anything changes
 *  (format version, the manifest's own checksum and every line of it, the
 *  parameter set, every offset and length against its file, every file's
 *  size and checksum): on an error (PSTAR_ERR_IO naming the file and the
 *  problem, PSTAR_ERR_INVALID_ARGUMENT for another parameter set,
 *  PSTAR_ERR_BUSY while a parameter is pinned) every value, the step, the
 *  hyperparameters and the loss scaler are as they were.  Only an I/O error
 *  after those checks (reading a verified file again, writing the NVMe
 *  tier) can stop a load part way: PSTAR_ERR_IO, and iterations, steps,
 *  saves and exports are refused until a load completes.  Training resumed
 *  from a checkpoint saved after step k reaches the same parameters, bit
 *  for bit, as training that never stopped.  A checkpoint of any world size
 *  loads into an engine of any world size; with world_size > 1 the load is
 *  a collective (every rank loads) and the ranks agree before anything
 *  changes, so a checkpoint refused on one rank fails on every rank with
 *  nothing loaded.  Format and guarantees: docs/checkpoints.md. */
PSTAR_API pstar_status pstar_checkpoint_load(pstar_engine *engine, const char *dir);

/** Writes every parameter's fp32 values (masters; frozen parameters' values)
 *  as a safetensors file at `path` (replaced atomically), for other tools.
 *  Legal after the build, between iterations. */
PSTAR_API pstar_status pstar_export_safetensors(pstar_engine *engine, const char *path);

/* ------------------------------------------------------------------------ */
/* Iterations                                                                */
/* ------------------------------------------------------------------------ */

/** Begins an iteration.  A TRAIN iteration ends with pstar_step(), an EVAL
 *  iteration with pstar_iteration_end(); either may be abandoned with
 *  pstar_iteration_abort(). */
PSTAR_API pstar_status pstar_iteration_begin(pstar_engine *engine, pstar_iteration_kind kind);

/** Ends an EVAL iteration.  Every parameter must be released. */
PSTAR_API pstar_status pstar_iteration_end(pstar_engine *engine);

/** Ends the current TRAIN or EVAL iteration without a step: for an
 *  iteration abandoned part way, e.g. from the caller's exception path.
 *  Legal while an iteration is in progress; otherwise
 *  PSTAR_ERR_INVALID_STATE and nothing changes.
 *
 *  Every parameter still acquired is released by this call (the caller's
 *  work on its memory must be complete, or ordered on the default stream,
 *  NULL).  Then nothing is updated: no Adam update, Adam's step count
 *  (PSTAR_HPARAM_STEP) does not advance, the loss scale and its scaler's
 *  state are unchanged.  The iteration's gradients are discarded: the fp32
 *  gradient buffers are freed, a parameter slot that holds a gradient gets
 *  its weight back from the fp32 master (as a skipped step does), and with
 *  options.grad_accumulation the gradients accumulated in this iteration's
 *  micro-batches are cleared.  Use counts are reset and every parameter is
 *  in HOLD, as after pstar_step().  Chunks stay where they are.
 *
 *  Placement: an aborted TRAIN iteration is not part of the trace.  During
 *  warm-up its partial recording is dropped and warm-up still takes as many
 *  completed iterations; an iteration that followed the trace stops
 *  following it (the next one follows from its start).  It is never
 *  counted in stats.trace_fallbacks (a divergence before the abort
 *  included); stats.iterations counts it (iterations begun).
 *
 *  Training after an abort reaches the same parameters and optimizer state,
 *  bit for bit, as if the aborted iteration had never begun.  Works in dry
 *  runs too.
 *
 *  With world_size > 1 (a data-parallel group) PSTAR_ERR_UNSUPPORTED and
 *  nothing changes: abandoning an iteration in a group would need every
 *  rank to agree; rebuild the group's engines from a checkpoint instead.
 *  An NVMe read error while restoring a weight still ends the iteration,
 *  then returns PSTAR_ERR_IO (training is refused until
 *  pstar_checkpoint_load(), as after a failed step). */
PSTAR_API pstar_status pstar_iteration_abort(pstar_engine *engine);

/** Returns the emulated device's compute stream handle (NULL on CUDA, where
 *  the caller's own streams are used).  Passing NULL as a stream to the
 *  calls below means the default stream. */
PSTAR_API pstar_status pstar_engine_compute_stream(pstar_engine *engine, void **out_stream);

/** Makes parameter `id` resident on the accelerator in the compute dtype and
 *  returns its address there.  The stream waits for the data; the pointer is
 *  valid for work ordered on `stream` until pstar_param_release().  A
 *  parameter may be acquired several times per stage, one acquire at a time.
 *  FORWARD and RECOMPUTE need a parameter slot holding weights; BACKWARD
 *  counts a backward use.  PSTAR_ERR_OUT_OF_MEMORY if the parameters
 *  acquired now cannot fit together.
 *
 *  The first BACKWARD use of a trainable parameter in an iteration opens
 *  its fp32 gradient accumulator: a 4 B/element buffer on the accelerator
 *  when there is room for it beside the chunks in use (and, for a parameter
 *  with more backward uses to come, room for one more chunk and its
 *  buffer), otherwise a host buffer.  The bits are the same either way;
 *  the host accumulator costs a copy of each contribution to the host
 *  instead of accelerator memory.  With world_size > 1, and with
 *  grad_accumulation for a chunk whose optimizer state is on the
 *  accelerator, the accumulator is always on the accelerator. */
PSTAR_API pstar_status pstar_param_acquire(pstar_engine *engine, uint32_t id,
                                           pstar_stage stage, void *stream, void **out_ptr);

/** Ends the use begun by the last acquire of `id`.  Work on `stream` that
 *  reads the data must have been queued before this call.  The release that
 *  makes a parameter's backward uses equal its forward uses turns its
 *  accumulated gradient into the content of its slot (flagged GRAD). */
PSTAR_API pstar_status pstar_param_release(pstar_engine *engine, uint32_t id, void *stream);

/** Adds `count` (= element count) gradient values of `dtype` from `grad` in
 *  `space` to parameter `id`'s fp32 gradient accumulator.  Legal while `id`
 *  is acquired in the BACKWARD stage of a TRAIN iteration; not for frozen
 *  parameters.  Values are as the caller computed them, i.e. multiplied by
 *  the current loss scale when one is in use.
 *
 *  Where `grad` lives is the caller's word, checked where it can be: the
 *  emulated device in strict mode tracks its own allocations and refuses
 *  (PSTAR_ERR_INVALID_ARGUMENT, nothing accumulated) a PSTAR_MEM_DEVICE
 *  gradient whose `count` elements do not lie inside one of them, and a
 *  PSTAR_MEM_HOST gradient that overlaps one.  Outside strict mode the
 *  emulated device accepts either space for any host-readable memory, and
 *  CUDA does not check (a wrong space fails in the copy or the kernel). */
PSTAR_API pstar_status pstar_grad_write(pstar_engine *engine, uint32_t id, const void *grad,
                                        uint64_t count, pstar_dtype dtype,
                                        pstar_mem_space space, void *stream);

/** pstar_grad_write() of the use's gradient, then pstar_param_release() of
 *  the use, in one call, for a caller that reads the weight no more after
 *  its gradient: the engine may then write the gradient straight into the
 *  parameter's slot, with no accumulator in between and no copy (the
 *  emulated device does, for the last backward use's only contribution in
 *  the compute dtype, one process without accumulation); elsewhere it is
 *  the two calls.  The same bits either way.  Work on `stream` that reads
 *  the weight must have been queued before this call.  A failed check of
 *  the gradient (as pstar_grad_write()'s) adds nothing and releases
 *  nothing. */
PSTAR_API pstar_status pstar_grad_write_release(pstar_engine *engine, uint32_t id, const void *grad,
                                                uint64_t count, pstar_dtype dtype,
                                                pstar_mem_space space, void *stream);

/** Returns the address of parameter `id`'s fp32 gradient accumulator on the
 *  accelerator (element count floats), for the caller to add its
 *  contribution in place.  Same legality as pstar_grad_write(); the pointer
 *  is valid until pstar_param_release() of that use.  For a parameter whose
 *  accumulator is on the host (see pstar_param_acquire()), this use borrows
 *  an accelerator buffer holding the sum so far (PSTAR_ERR_OUT_OF_MEMORY
 *  when even that has no room); pstar_grad_write() needs none. */
PSTAR_API pstar_status pstar_grad_slot_acquire(pstar_engine *engine, uint32_t id, void *stream,
                                               float **out_ptr);

/** Virtual clock only: advances the modelled clock by `seconds` of the
 *  caller's compute (queued copies progress meanwhile).  PSTAR_ERR_UNSUPPORTED
 *  on a wall clock; PSTAR_ERR_INVALID_ARGUMENT for a negative, NaN or
 *  infinite `seconds` or one that would make the clock infinite. */
PSTAR_API pstar_status pstar_clock_advance(pstar_engine *engine, double seconds);

/** Seconds on the engine's clock since it was created: modelled seconds with
 *  options.virtual_clock, wall seconds otherwise. */
PSTAR_API pstar_status pstar_clock_now(pstar_engine *engine, double *out_seconds);

/** Writes the timeline kept with options.record_timeline as a Chrome trace
 *  (JSON, opens in Perfetto or chrome://tracing) to the file at `path`:
 *  every move as a span on its copy stream (modelled duration on the
 *  virtual clock, issue time only on a wall clock), and per moment the bytes
 *  per tier (chunks, gradient buffers, non-model on the accelerator; host)
 *  as counters.  PSTAR_ERR_INVALID_STATE without record_timeline;
 *  PSTAR_ERR_IO when the file cannot be written. */
PSTAR_API pstar_status pstar_trace_export(pstar_engine *engine, const char *path);

/** Reports the bytes of non-model memory (activations, workspace) that the
 *  caller holds on the accelerator now.  Counted against the capacity of
 *  the accelerator tier until the next report. */
PSTAR_API pstar_status pstar_nonmodel_report(pstar_engine *engine, uint64_t bytes);

/* ------------------------------------------------------------------------ */
/* Optimizer step                                                            */
/* ------------------------------------------------------------------------ */

#define PSTAR_STEP_RESULT_VERSION 1

/** What pstar_step() did. */
typedef struct pstar_step_result {
  uint32_t size;    /**< sizeof(pstar_step_result) as the caller compiled it. */
  uint32_t version; /**< PSTAR_STEP_RESULT_VERSION as the caller compiled it. */
  /** Adam's step count after this call (not advanced by a skipped step). */
  uint64_t step;
  /** Nonzero if the step was skipped (inf or NaN in a gradient). */
  int32_t skipped;
  /** Number of parameters updated. */
  uint32_t params_updated;
  /** Global L2 norm of the unscaled gradients (before clipping). */
  double grad_norm;
  /** Loss scale used by this step's gradients. */
  float loss_scale;
  /** Loss scale for the next iteration's gradients. */
  float next_loss_scale;
  /** Factor applied by clipping (1 if none). */
  float clip_coef;
} pstar_step_result;

#define PSTAR_STEP_RESULT_INIT \
  { sizeof(pstar_step_result), PSTAR_STEP_RESULT_VERSION, 0, 0, 0, 0.0, 0.0f, 0.0f, 0.0f }

/** Writes an initialised pstar_step_result. */
PSTAR_API pstar_status pstar_step_result_init(pstar_step_result *result);

/** Ends a TRAIN iteration: unscales, clips and applies Adam to every
 *  parameter with a gradient, then restores weights into the parameter
 *  slots.  With an inf or NaN gradient the step is skipped as a whole (loss
 *  scale backed off for F16) and the weights are restored unchanged.
 *  Parameters without a backward use this iteration are not updated.
 *  With world_size > 1 the gradients are the average over the ranks (summed
 *  in fp32, divided by world_size), the norm and the overflow decision are
 *  the same on every rank, and each rank updates its own shards.
 *  `result` may be NULL. */
PSTAR_API pstar_status pstar_step(pstar_engine *engine, pstar_step_result *result);

/** Hyperparameters settable between steps (schedules). */
typedef enum pstar_hparam {
  PSTAR_HPARAM_LR = 0,
  PSTAR_HPARAM_BETA1 = 1,
  PSTAR_HPARAM_BETA2 = 2,
  PSTAR_HPARAM_EPS = 3,
  PSTAR_HPARAM_WEIGHT_DECAY = 4,
  PSTAR_HPARAM_CLIP_NORM = 5,
  /** The current loss scale (F16); set it to override the dynamic scaler. */
  PSTAR_HPARAM_LOSS_SCALE = 6,
  /** Read-only: Adam's step count. */
  PSTAR_HPARAM_STEP = 7,
  PSTAR_HPARAM_FORCE_32BIT_ = -0x7fffffff - 1
} pstar_hparam;

/** Sets a hyperparameter for the next step.  Legal at any time after
 *  create: between steps, in EVAL iterations, and inside a TRAIN iteration
 *  until its pstar_step(), so that a schedule or a clipping call made after
 *  the backward (a torch optimizer's step(), torch's clip_grad_norm_)
 *  reaches this iteration's step.  Inside a TRAIN iteration
 *  PSTAR_HPARAM_LOSS_SCALE is refused (PSTAR_ERR_INVALID_STATE: the
 *  iteration's gradients were scaled by the current scale).  A value set
 *  inside an iteration is the one its step uses; the results are the bits
 *  of the same value set before the iteration began, the speculative
 *  update included (a chunk updated ahead with other constants is updated
 *  again at the step).  `value` is rounded to float (round to nearest; beyond
 *  FLT_MAX: infinity), the library's storage, and the float is checked:
 *  LR, WEIGHT_DECAY and CLIP_NORM in [0, 1e30] (the float nearest 1e30);
 *  BETA1 and BETA2 in [0, 1), so 0.99999999999, which rounds to 1, is
 *  refused and the largest accepted value is 1 - 2^-24; EPS in
 *  [FLT_MIN, 1e30] (a normal float: a value that rounds to 0 or to a
 *  subnormal is refused); LOSS_SCALE in [FLT_MIN, FLT_MAX] (so that its
 *  inverse is finite).  Negative zero counts as zero where 0 is allowed and
 *  is stored as given.  A refused value changes nothing
 *  (PSTAR_ERR_INVALID_ARGUMENT, the message gives the value and the float
 *  it rounds to); an accepted one reads back as that float.  The ranges of
 *  the options are the same.  What the ranges do not cover: products of
 *  extreme values (lr times a parameter's lr_scale, lr times weight_decay)
 *  may still overflow in a step. */
PSTAR_API pstar_status pstar_hparam_set(pstar_engine *engine, pstar_hparam which, double value);

/** The global L2 norm of this TRAIN iteration's gradients, unscaled (the
 *  caller's gradients divided by the loss scale), as pstar_step() will
 *  report it in pstar_step_result.grad_norm and compare with the clipping
 *  threshold if nothing changes before it: the same bits.  Infinity when a
 *  gradient holds an inf or NaN (the step will be skipped).  With
 *  options.grad_accumulation, the sum of the micro-batches so far.  For a
 *  caller that reports the norm or chooses the clipping threshold before
 *  the step (torch's clip_grad_norm_ returns the norm it clips by): set
 *  PSTAR_HPARAM_CLIP_NORM then call pstar_step().  Legal in a TRAIN
 *  iteration with no parameter acquired and every backward complete (each
 *  parameter with backward uses has as many as forward uses), otherwise
 *  PSTAR_ERR_INVALID_STATE.  With world_size > 1 PSTAR_ERR_UNSUPPORTED (the
 *  norm is known only after the step's reduce-scatter: read
 *  pstar_step_result.grad_norm). */
PSTAR_API pstar_status pstar_grad_norm(pstar_engine *engine, double *out_norm);

/** Reads a hyperparameter. */
PSTAR_API pstar_status pstar_hparam_get(pstar_engine *engine, pstar_hparam which,
                                        double *out_value);

/* ------------------------------------------------------------------------ */
/* Statistics                                                                */
/* ------------------------------------------------------------------------ */

#define PSTAR_STATS_VERSION 3

/** Counters since the engine was created. */
typedef struct pstar_stats {
  uint32_t size;    /**< sizeof(pstar_stats) as the caller compiled it. */
  uint32_t version; /**< PSTAR_STATS_VERSION as the caller compiled it. */
  uint64_t bytes_host_to_device; /**< Bytes copied host to accelerator. */
  uint64_t bytes_device_to_host; /**< Bytes copied accelerator to host. */
  uint64_t moves_to_device;      /**< Chunks moved to the accelerator. */
  uint64_t evictions;            /**< Chunks evicted from the accelerator. */
  /** Peak bytes in use on the accelerator (chunks, gradient buffers,
   *  non-model reports, optimizer state placed there). */
  uint64_t peak_device_bytes;
  uint64_t peak_host_bytes; /**< Peak bytes the engine held in host memory. */
  uint64_t device_bytes;    /**< Bytes in use now on the accelerator. */
  uint64_t host_bytes;      /**< Bytes held now in host memory. */
  /** Chunks of the compute-dtype list (all parameters). */
  uint32_t compute_chunks;
  /** Chunks of each fp32 optimizer list (master, m, v; trainable
   *  parameters only). */
  uint32_t optimizer_chunks;
  /** Of those, chunks holding one parameter larger than chunk_elems. */
  uint32_t jumbo_chunks;
  uint32_t reserved0; /**< Padding; 0. */
  uint64_t compute_list_bytes;   /**< Bytes of the compute-dtype list. */
  uint64_t optimizer_list_bytes; /**< Bytes of one fp32 optimizer list. */
  /** Parameter elements over chunk capacity, compute list (0..1). */
  double fill_ratio;
  uint64_t steps;         /**< Steps applied (Adam updates). */
  uint64_t skipped_steps; /**< Steps skipped for an inf or NaN gradient. */
  uint64_t iterations;    /**< Iterations begun. */

  /* Version 2 */
  /** TRAIN iterations whose access order diverged from the trace (each one
   *  ran on LRU from the divergence on and was recorded as the new trace). */
  uint64_t trace_fallbacks;
  /** Moments (acquires) of the trace guiding placement; 0 before warm-up ends. */
  uint64_t trace_moments;
  /** Bytes copied to the accelerator ahead of use (part of
   *  bytes_host_to_device). */
  uint64_t bytes_prefetched;
  /** Bytes an acquire had to wait for: chunks fetched on demand, and
   *  prefetches still in flight when their chunk was acquired. */
  uint64_t bytes_critical;

  /* Version 3 */
  /** Seconds on the engine's clock (see pstar_clock_now()). */
  double clock_seconds;
  /** Seconds the caller waited for moves: in acquires, in non-model
   *  reports, and in the step for chunks leaving the accelerator. */
  double wait_seconds;
  /** Peak bytes of chunks alone on the accelerator. */
  uint64_t peak_device_chunk_bytes;
  /** Moments at which placement had to exceed its window budget (chunks in
   *  use and gradient buffers alone left no room): 0 in a well-sized run. */
  uint64_t budget_overruns;
  /** Hybrid optimizer placement (options.hybrid_optimizer): trainable
   *  chunks whose optimizer state lives on the accelerator. */
  uint32_t optimizer_chunks_on_device;
  uint32_t reserved1; /**< Padding; 0. */
  /** Bytes of that state on the accelerator (counted in device_bytes and
   *  the device peak). */
  uint64_t optimizer_device_bytes;
  /** Data parallelism: this engine's rank (0 for a single process). */
  int32_t rank;
  int32_t world_size; /**< The number of ranks (1 for a single process). */
  /** Bytes of the all-gathers this engine issued (their full outputs:
   *  gathered chunks in the compute dtype, and whole chunks of fp32 masters
   *  or compute payloads for pstar_param_read). */
  uint64_t bytes_all_gathered;
  /** Bytes of its reduce-scatters (their full fp32 inputs: one chunk of
   *  gradients each). */
  uint64_t bytes_reduce_scattered;
  /** Collectives it issued: all-gathers, reduce-scatters, and the
   *  rendezvous' and the step's exchanges. */
  uint64_t collectives;
} pstar_stats;

#define PSTAR_STATS_INIT \
  { sizeof(pstar_stats), PSTAR_STATS_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0, \
    0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/** Writes an initialised pstar_stats. */
PSTAR_API pstar_status pstar_stats_init(pstar_stats *stats);

/** Fills *stats (its size and version fields must be set). */
PSTAR_API pstar_status pstar_engine_get_stats(pstar_engine *engine, pstar_stats *stats);

/* ------------------------------------------------------------------------ */
/* Experimental tier                                                         */
/* ------------------------------------------------------------------------ */

#if defined(PSTAR_EXPERIMENTAL_API) || defined(PSTAR_DOXYGEN)
/* Declared only when the program defines PSTAR_EXPERIMENTAL_API before
 * including this header.  Names begin with pstar_x_; they may change or go in
 * any release, and the ABI check ignores them (docs/api-stability.md). */

/** Current version of pstar_x_nvme_options. */
#define PSTAR_X_NVME_OPTIONS_VERSION 1

/** Experimental: the NVMe tier (docs/nvme.md).  With it, the fp32 optimizer
 *  state (master, Adam m and v) of trainable chunks that do not fit in
 *  options.host_capacity_bytes lives in a file under `dir` and pstar_step()
 *  streams it through a ring of host staging buffers: the read of the next
 *  chunks and the write-back of the previous ones overlap the update of the
 *  current one.  With world_size > 1 each rank does this with its own
 *  shards of the lists (give each rank its own directory or file system).
 *  No hybrid placement.  A dry run places and counts the same way without
 *  a file and advances its clock by each step's modelled drive time. */
typedef struct pstar_x_nvme_options {
  /** sizeof(pstar_x_nvme_options) as the caller compiled it. */
  uint32_t size;
  /** PSTAR_X_NVME_OPTIONS_VERSION as the caller compiled it. */
  uint32_t version;
  /** An existing directory on the drive to use; the engine creates one data
   *  file in it (pstar-nvme-XXXXXX) and removes it when destroyed. */
  const char *dir;
  /** Reads and writes in flight at once; 0 = 8. */
  uint32_t max_inflight;
  /** Host staging buffers of the step's ring (each holds one chunk's master,
   *  m and v), at least 2; 0 = 4.  They count against host_capacity_bytes. */
  uint32_t staging_buffers;
  /** Nonzero: buffered I/O even where the filesystem takes O_DIRECT. */
  int32_t buffered;
  /** Bytes of the drive the engine may fill; 0 = no limit (the file system
   *  says when it is full).  A build whose optimizer state would need more
   *  fails with PSTAR_ERR_OUT_OF_MEMORY. */
  uint64_t capacity_bytes;
  /** Modelled sequential read bandwidth of the drive, bytes per second,
   *  used by a dry run's clock only; 0 = PSTAR_X_DEFAULT_NVME_READ_BYTES_PER_S. */
  double read_bytes_per_s;
  /** Modelled write bandwidth, as read_bytes_per_s; 0 =
   *  PSTAR_X_DEFAULT_NVME_WRITE_BYTES_PER_S. */
  double write_bytes_per_s;
} pstar_x_nvme_options;

/** Default modelled read bandwidth of the drive: 3.5 GB/s, a PCIe 3.0 x4
 *  NVMe drive's sequential read. */
#define PSTAR_X_DEFAULT_NVME_READ_BYTES_PER_S 3.5e9
/** Default modelled write bandwidth: 3.0 GB/s. */
#define PSTAR_X_DEFAULT_NVME_WRITE_BYTES_PER_S 3.0e9

/** Experimental: fills *options with the defaults (dir NULL). */
PSTAR_API pstar_status pstar_x_nvme_options_init(pstar_x_nvme_options *options);

/** Experimental: gives the engine an NVMe tier; legal once, before
 *  pstar_engine_build().  PSTAR_ERR_UNSUPPORTED with hybrid optimizer
 *  placement or a library built without libuv and xxhash;
 *  PSTAR_ERR_INVALID_ARGUMENT or PSTAR_ERR_IO for a directory it
 *  cannot use.  After an I/O error (disk full, the file removed, a checksum
 *  mismatch, a failed read or write) inside pstar_step() the engine refuses
 *  further iterations with PSTAR_ERR_IO until pstar_checkpoint_load()
 *  rewrites every state. */
PSTAR_API pstar_status pstar_x_engine_set_nvme(pstar_engine *engine, const pstar_x_nvme_options *options);

/** Current version of pstar_x_nvme_stats. */
#define PSTAR_X_NVME_STATS_VERSION 1

/** Experimental: what the NVMe tier holds and has moved. */
typedef struct pstar_x_nvme_stats {
  /** sizeof(pstar_x_nvme_stats) as the caller compiled it. */
  uint32_t size;
  /** PSTAR_X_NVME_STATS_VERSION as the caller compiled it. */
  uint32_t version;
  /** Nonzero: the data file is read and written with O_DIRECT; zero:
   *  buffered (the page cache is in the figures). */
  int32_t direct;
  /** Trainable chunks whose optimizer state lives on the drive. */
  uint32_t chunks_on_nvme;
  /** Bytes of optimizer state on the drive (padded to 4 KiB per chunk). */
  uint64_t bytes_on_nvme;
  /** Bytes read from and written to the data file since the engine was
   *  built, by every path (padded lengths, as the drive moves them; 0 in a
   *  dry run, which has no file). */
  uint64_t bytes_read;
  /** See bytes_read. */
  uint64_t bytes_written;
  /** Seconds pstar_step() spent waiting for the drive (not overlapped with
   *  the update), summed over steps; in a dry run, the modelled drive time
   *  its clock advanced by. */
  double step_io_wait_seconds;
  /** Bytes the steps read from and wrote to the drive (counted the same way
   *  in a dry run and in a run with payloads). */
  uint64_t step_bytes_read;
  /** See step_bytes_read. */
  uint64_t step_bytes_written;
} pstar_x_nvme_stats;

/** Experimental: sets *stats's size and version and zeroes the rest. */
PSTAR_API pstar_status pstar_x_nvme_stats_init(pstar_x_nvme_stats *stats);

/** Experimental: fills *stats (initialised by pstar_x_nvme_stats_init());
 *  PSTAR_ERR_INVALID_STATE if the engine has no NVMe tier. */
PSTAR_API pstar_status pstar_x_nvme_get_stats(pstar_engine *engine, pstar_x_nvme_stats *stats);

/** Most chunks pstar_x_engine_set_gather_ahead() accepts. */
#define PSTAR_X_MAX_GATHER_AHEAD 16

/** Experimental: gathering ahead (docs/distributed.md).  With world_size > 1
 *  every rank records the gathers of a TRAIN iteration; a later TRAIN
 *  iteration that makes the same acquires issues each of them up to
 *  `chunks` gathers before the acquire that needs it, into one of `chunks`
 *  chunk-sized device slots reserved at build, on a thread of the engine's
 *  own, so that the all-gather runs while the caller computes.  A chunk too
 *  large for a slot (a parameter larger than chunk_elems), or one due while
 *  every slot holds a chunk still in use, is gathered at its acquire as
 *  without this option.  The same thread also runs the gradients'
 *  reduce-scatters (a second host buffer pair lets one run while the next
 *  is laid out).  Every rank must pass the same value (the build checks,
 *  like the layout).  0 (the default) gathers at the acquire.
 *  Legal before pstar_engine_build() only; no effect with one process.
 *  PSTAR_ERR_INVALID_ARGUMENT above PSTAR_X_MAX_GATHER_AHEAD; the build
 *  fails with PSTAR_ERR_OUT_OF_MEMORY on every rank when some rank's
 *  device capacity cannot hold the slots. */
PSTAR_API pstar_status pstar_x_engine_set_gather_ahead(pstar_engine *engine, uint32_t chunks);

/** Current version of pstar_x_gather_stats. */
#define PSTAR_X_GATHER_STATS_VERSION 2

/** Experimental: what gathering ahead did since the engine was built. */
typedef struct pstar_x_gather_stats {
  /** sizeof(pstar_x_gather_stats) as the caller compiled it. */
  uint32_t size;
  /** PSTAR_X_GATHER_STATS_VERSION as the caller compiled it. */
  uint32_t version;
  /** The depth set with pstar_x_engine_set_gather_ahead() (0 with one
   *  process). */
  uint32_t depth;
  /** Nonzero: a recorded schedule is in place for the next TRAIN
   *  iteration. */
  int32_t schedule_ready;
  /** Device bytes the slots hold, from build on. */
  uint64_t slot_bytes;
  /** All-gathers issued into a slot from the schedule. */
  uint64_t gathers_ahead;
  /** All-gathers issued by the acquire that needed the chunk (every gather
   *  without a schedule, and scheduled ones that could not take a slot);
   *  counted when depth is above 0. */
  uint64_t gathers_on_demand;
  /** Acquires that found their chunk's ahead gather still running. */
  uint64_t gathers_waited;
  /** TRAIN iterations that left the schedule (another acquire than the
   *  recorded one, more or fewer acquires, a gather at another point); the
   *  next TRAIN iteration records a new one. */
  uint64_t schedule_fallbacks;
  /** Seconds acquires waited for ahead gathers, summed. */
  double wait_seconds;

  /* Version 2 */
  /** Bytes the all-gathers of chunks copied host to accelerator: this
   *  rank's own shard of each gathered chunk, before the collective fills
   *  the other blocks (1/world_size of the gathers' bytes_all_gathered,
   *  less the shards of chunks whose optimizer state hybrid placement put
   *  on the device: their compute shard lives there and is copied on the
   *  accelerator).  Not in pstar_stats.bytes_host_to_device, which counts
   *  placement's moves. */
  uint64_t bytes_shard_host_to_device;
  /** Bytes the gradients' reduce-scatters copied accelerator to host: this
   *  rank's fp32 block of each sum with a communicator that reduces device
   *  memory (NCCL), the chunk's fp32 gradient buffers laid out in host
   *  staging with one that reduces host memory (Gloo).  Not in
   *  pstar_stats.bytes_device_to_host. */
  uint64_t bytes_reduce_device_to_host;
} pstar_x_gather_stats;

/** Experimental: sets *stats's size and version and zeroes the rest. */
PSTAR_API pstar_status pstar_x_gather_stats_init(pstar_x_gather_stats *stats);

/** Experimental: fills *stats (initialised by pstar_x_gather_stats_init()). */
PSTAR_API pstar_status pstar_x_gather_get_stats(pstar_engine *engine, pstar_x_gather_stats *stats);

/** Experimental: the overlapped step (docs/design.md, "The step's
 *  pipeline").  Nonzero (the default): pstar_step() decides skip or clip
 *  from the complete gradient norm, queues the CPU updates of the trained
 *  chunks on a thread of the engine's own, in the order the next TRAIN
 *  iteration first uses them, and returns; the next iteration's acquire of
 *  a chunk waits for that chunk's update only.  Every call that reads or
 *  writes values, masters, optimizer state or statistics
 *  (pstar_param_read/write, pins, checkpoints, exports, pstar_hparam_set,
 *  pstar_engine_get_stats, the next pstar_step, pstar_iteration_abort,
 *  destroy) first waits for the step in flight.  The results are the bits
 *  of the synchronous step.  0: pstar_step() returns once every update is
 *  done.  With world_size > 1 each rank's host shards are updated so (an
 *  all-gather, ahead of use too, waits for its chunk's update before it
 *  reads the shard).  With an NVMe tier (pstar_x_engine_set_nvme()) the
 *  same thread streams the drive's chunks through the staging ring, and an
 *  I/O error there is returned by the next call that waits for the step.
 *  On the virtual clock (options.virtual_clock: what placement does stays
 *  a function of the calls alone) and in a dry run the updates are applied
 *  at pstar_step(); their time is modelled only with
 *  pstar_x_engine_set_modelled_host_update().  Legal before
 *  pstar_engine_build() only. */
PSTAR_API pstar_status pstar_x_engine_set_overlap_step(pstar_engine *engine, int enabled);

/** Experimental: the time of the CPU update on the virtual clock
 *  (options.virtual_clock or options.dry_run; one process).  A chunk's
 *  update then takes elements x (2 x the compute dtype's size + 24) /
 *  bytes_per_s modelled seconds: the bytes a fused Adam pass moves per
 *  element.  With the overlapped step (pstar_x_engine_set_overlap_step(),
 *  the default) that time runs beside the caller, chunk after chunk in the
 *  step's order, and a chunk's next fetch and acquire wait for its update's
 *  end; without it pstar_step() advances the clock by all of it.  The
 *  updates themselves are applied at pstar_step() either way (the same
 *  bits).  0 (the default): the update takes no modelled time.
 *  bytes_per_s must be 0 or in [1, 1e18].  Legal before
 *  pstar_engine_build() only; PSTAR_ERR_UNSUPPORTED on the wall clock or
 *  with world_size > 1. */
PSTAR_API pstar_status pstar_x_engine_set_modelled_host_update(pstar_engine *engine, double bytes_per_s);

/** Experimental: the speculative update (docs/design.md, "The speculative
 *  update").  With the overlapped step, a chunk whose backward is over is
 *  updated during the rest of the backward, before the norm is complete,
 *  as if the step were applied unclipped: out of place, into buffers of
 *  the engine's own (three fp32 lists and a compute payload per chunk).
 *  pstar_step() keeps a chunk's result when its constants are those the
 *  step computes (the step is not skipped and the clipping coefficient is
 *  exactly 1) and discards it otherwise, updating that chunk in place as
 *  without speculation: the bits are the same either way.  max_bytes
 *  bounds the host memory those buffers hold at once (0, the default: no
 *  speculation; UINT64_MAX: as much as the model needs, about 14 bytes per
 *  fp16 parameter).  Speculation needs one process without gradient
 *  accumulation and an overlapped step; a chunk with pinned masters or
 *  optimizer state on the accelerator is not speculated.  Legal before
 *  pstar_engine_build() only. */
PSTAR_API pstar_status pstar_x_engine_set_speculative_update(pstar_engine *engine, uint64_t max_bytes);

/** Current version of pstar_x_step_stats.  Version 2 added
 *  chunks_speculated and speculations_discarded. */
#define PSTAR_X_STEP_STATS_VERSION 2

/** Experimental: what the overlapped step did since the engine was built. */
typedef struct pstar_x_step_stats {
  /** sizeof(pstar_x_step_stats) as the caller compiled it. */
  uint32_t size;
  /** PSTAR_X_STEP_STATS_VERSION as the caller compiled it. */
  uint32_t version;
  /** Nonzero: the engine overlaps its steps (set, and possible here). */
  int32_t overlap;
  /** Zero (alignment of the fields below). */
  int32_t reserved;
  /** Steps whose CPU updates ran on the engine's update thread (after the
   *  step, or kept from a speculation during its backward). */
  uint64_t steps_overlapped;
  /** Chunks updated there. */
  uint64_t chunks_updated;
  /** Seconds the update thread spent updating chunks, summed. */
  double update_seconds;
  /** Seconds calls waited for overlapped updates (an acquire for its
   *  chunk's, the others for the whole step), summed: the part of the
   *  updates the caller saw. */
  double wait_seconds;
  /** Chunks whose speculative update a step kept (counted in
   *  chunks_updated too). */
  uint64_t chunks_speculated;
  /** Speculative updates a step, an abort or another call discarded
   *  (computed, or queued, and then not kept). */
  uint64_t speculations_discarded;
} pstar_x_step_stats;

/** Experimental: sets *stats's size and version and zeroes the rest. */
PSTAR_API pstar_status pstar_x_step_stats_init(pstar_x_step_stats *stats);

/** Experimental: fills *stats (initialised by pstar_x_step_stats_init()).
 *  Waits for the step in flight first. */
PSTAR_API pstar_status pstar_x_step_get_stats(pstar_engine *engine, pstar_x_step_stats *stats);

#endif /* PSTAR_EXPERIMENTAL_API */

#ifdef __cplusplus
}
#endif

#endif /* PSTAR_PSTAR_H */
