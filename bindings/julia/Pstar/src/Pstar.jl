"""
    Pstar

libpstar for Julia: `ccall` wrappers of the C API (`pstar/pstar.h`) and a
thin Julia layer (`Engine` with a finalizer, `@check` throwing `PstarError`).

NOT RUN: Julia cannot be installed on the machines this project is built
on. `bindings/julia/check_wrappers.py` (CTest `julia_wrappers`) checks this
file against the header instead: every exported function wrapped with the
same argument count and C types of the same width, every enum value, and
the offsets and size of every mirrored struct against a compiled C probe.

The library is found as `libpstar` through the loader (set
`JULIA_PSTAR_LIBRARY` to a path to override).
"""
module Pstar

using Libdl

const libpstar = get(ENV, "JULIA_PSTAR_LIBRARY", "libpstar")

# ---------------------------------------------------------------------------
# Enums: integer constants with their C names (a status added by a later
# library is just another Cint).

const PSTAR_OK = Cint(0)
const PSTAR_ERR_INVALID_ARGUMENT = Cint(-1)
const PSTAR_ERR_INVALID_HANDLE = Cint(-2)
const PSTAR_ERR_INVALID_STATE = Cint(-3)
const PSTAR_ERR_NOT_FOUND = Cint(-4)
const PSTAR_ERR_OUT_OF_MEMORY = Cint(-5)
const PSTAR_ERR_BUSY = Cint(-6)
const PSTAR_ERR_UNSUPPORTED = Cint(-7)
const PSTAR_ERR_DEVICE = Cint(-8)
const PSTAR_ERR_IO = Cint(-9)
const PSTAR_ERR_COMM = Cint(-10)
const PSTAR_ERR_VERSION = Cint(-11)
const PSTAR_ERR_INTERNAL = Cint(-12)

const PSTAR_DTYPE_F32 = Cint(0)
const PSTAR_DTYPE_F16 = Cint(1)
const PSTAR_DTYPE_BF16 = Cint(2)

const PSTAR_DEVICE_EMULATED = Cint(0)
const PSTAR_DEVICE_CUDA = Cint(1)

const PSTAR_STAGE_FORWARD = Cint(0)
const PSTAR_STAGE_BACKWARD = Cint(1)
const PSTAR_STAGE_RECOMPUTE = Cint(2)

const PSTAR_ITERATION_TRAIN = Cint(0)
const PSTAR_ITERATION_EVAL = Cint(1)

const PSTAR_MEM_HOST = Cint(0)
const PSTAR_MEM_DEVICE = Cint(1)

const PSTAR_PARAM_DEFAULT = Cint(0)
const PSTAR_PARAM_FROZEN = Cint(1)
const PSTAR_PARAM_NO_WEIGHT_DECAY = Cint(2)

const PSTAR_POLICY_OPT = Cint(0)
const PSTAR_POLICY_LRU = Cint(1)
const PSTAR_POLICY_STATIC = Cint(2)

const PSTAR_STATE_FP32 = Cint(0)
const PSTAR_STATE_BF16 = Cint(1)
const PSTAR_STATE_INT8 = Cint(2)

const PSTAR_MASTER_FP32 = Cint(0)
const PSTAR_MASTER_BF16 = Cint(1)

const PSTAR_LOG_DEBUG = Cint(0)
const PSTAR_LOG_INFO = Cint(1)
const PSTAR_LOG_WARN = Cint(2)
const PSTAR_LOG_ERROR = Cint(3)
const PSTAR_LOG_OFF = Cint(4)

const PSTAR_HPARAM_LR = Cint(0)
const PSTAR_HPARAM_BETA1 = Cint(1)
const PSTAR_HPARAM_BETA2 = Cint(2)
const PSTAR_HPARAM_EPS = Cint(3)
const PSTAR_HPARAM_WEIGHT_DECAY = Cint(4)
const PSTAR_HPARAM_CLIP_NORM = Cint(5)
const PSTAR_HPARAM_LOSS_SCALE = Cint(6)
const PSTAR_HPARAM_STEP = Cint(7)

# ---------------------------------------------------------------------------
# Structs (C layout: isbits fields in the header's order).

mutable struct EngineOptions
    size::UInt32
    version::UInt32
    device::Cint
    device_ordinal::Int32
    device_capacity_bytes::UInt64
    host_capacity_bytes::UInt64
    chunk_elems::UInt64
    threads::UInt32
    strict::Int32
    strict_seed::UInt64
    compute_dtype::Cint
    lr::Float32
    beta1::Float32
    beta2::Float32
    eps::Float32
    weight_decay::Float32
    adamw::Int32
    clip_norm::Float32
    loss_scale_initial::Float32
    loss_scale_growth_factor::Float32
    loss_scale_backoff_factor::Float32
    loss_scale_growth_interval::UInt32
    loss_scale_hysteresis::UInt32
    loss_scale_min::Float32
    grad_accumulation::Int32
    placement_policy::Cint
    warmup_iterations::UInt32
    prefetch::Int32
    virtual_clock::Int32
    dry_run::Int32
    h2d_bytes_per_s::Float64
    d2h_bytes_per_s::Float64
    device_margin_bytes::UInt64
    record_timeline::Int32
    hybrid_optimizer::Int32
    rank::Int32
    world_size::Int32
    comm_timeout_ms::UInt32
    state_format::Cint
    master_format::Cint
    master_seed::UInt64
    EngineOptions() = new()
end

mutable struct StepResult
    size::UInt32
    version::UInt32
    step::UInt64
    skipped::Int32
    params_updated::UInt32
    grad_norm::Float64
    loss_scale::Float32
    next_loss_scale::Float32
    clip_coef::Float32
    StepResult() = new()
end

mutable struct Stats
    size::UInt32
    version::UInt32
    bytes_host_to_device::UInt64
    bytes_device_to_host::UInt64
    moves_to_device::UInt64
    evictions::UInt64
    peak_device_bytes::UInt64
    peak_host_bytes::UInt64
    device_bytes::UInt64
    host_bytes::UInt64
    compute_chunks::UInt32
    optimizer_chunks::UInt32
    jumbo_chunks::UInt32
    reserved0::UInt32
    compute_list_bytes::UInt64
    optimizer_list_bytes::UInt64
    fill_ratio::Float64
    steps::UInt64
    skipped_steps::UInt64
    iterations::UInt64
    trace_fallbacks::UInt64
    trace_moments::UInt64
    bytes_prefetched::UInt64
    bytes_critical::UInt64
    clock_seconds::Float64
    wait_seconds::Float64
    peak_device_chunk_bytes::UInt64
    budget_overruns::UInt64
    optimizer_chunks_on_device::UInt32
    reserved1::UInt32
    optimizer_device_bytes::UInt64
    rank::Int32
    world_size::Int32
    bytes_all_gathered::UInt64
    bytes_reduce_scattered::UInt64
    collectives::UInt64
    Stats() = new()
end

# ---------------------------------------------------------------------------
# The C API, one wrapper per function (same argument count and widths).

pstar_version() = ccall((:pstar_version, libpstar), UInt32, ())
pstar_version_string() = ccall((:pstar_version_string, libpstar), Cstring, ())
pstar_status_name(status) = ccall((:pstar_status_name, libpstar), Cstring, (Cint,), status)
pstar_status_string(status) = ccall((:pstar_status_string, libpstar), Cstring, (Cint,), status)
pstar_last_error_message() = ccall((:pstar_last_error_message, libpstar), Cstring, ())
pstar_log_set_callback(fn, user, min_level) =
    ccall((:pstar_log_set_callback, libpstar), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Cint), fn, user, min_level)
pstar_free(ptr) = ccall((:pstar_free, libpstar), Cvoid, (Ptr{Cvoid},), ptr)
pstar_engine_options_init(options) =
    ccall((:pstar_engine_options_init, libpstar), Cint, (Ref{EngineOptions},), options)
pstar_engine_create(options, out_engine) =
    ccall((:pstar_engine_create, libpstar), Cint, (Ref{EngineOptions}, Ref{Ptr{Cvoid}}), options, out_engine)
pstar_engine_destroy(engine) = ccall((:pstar_engine_destroy, libpstar), Cint, (Ptr{Cvoid},), engine)
pstar_param_register(engine, name, ndim, shape, flags, out_id) =
    ccall((:pstar_param_register, libpstar), Cint, (Ptr{Cvoid}, Cstring, UInt32, Ptr{Int64}, UInt32, Ref{UInt32}),
          engine, name, ndim, shape, flags, out_id)
pstar_engine_build(engine) = ccall((:pstar_engine_build, libpstar), Cint, (Ptr{Cvoid},), engine)
pstar_param_find(engine, name, out_id) =
    ccall((:pstar_param_find, libpstar), Cint, (Ptr{Cvoid}, Cstring, Ref{UInt32}), engine, name, out_id)
pstar_param_count(engine, out_count) =
    ccall((:pstar_param_count, libpstar), Cint, (Ptr{Cvoid}, Ref{UInt32}), engine, out_count)
pstar_param_numel(engine, id, out_numel) =
    ccall((:pstar_param_numel, libpstar), Cint, (Ptr{Cvoid}, UInt32, Ref{UInt64}), engine, id, out_numel)
pstar_param_set_lr_scale(engine, id, lr_scale) =
    ccall((:pstar_param_set_lr_scale, libpstar), Cint, (Ptr{Cvoid}, UInt32, Float32), engine, id, lr_scale)
pstar_param_set_weight_decay(engine, id, enabled) =
    ccall((:pstar_param_set_weight_decay, libpstar), Cint, (Ptr{Cvoid}, UInt32, Int32), engine, id, enabled)
pstar_param_write(engine, id, src, count, dtype) =
    ccall((:pstar_param_write, libpstar), Cint, (Ptr{Cvoid}, UInt32, Ptr{Cvoid}, UInt64, Cint),
          engine, id, src, count, dtype)
pstar_param_read(engine, id, dst, count, dtype) =
    ccall((:pstar_param_read, libpstar), Cint, (Ptr{Cvoid}, UInt32, Ptr{Cvoid}, UInt64, Cint),
          engine, id, dst, count, dtype)
pstar_param_pin(engine, id, writable, out_ptr, out_dtype) =
    ccall((:pstar_param_pin, libpstar), Cint, (Ptr{Cvoid}, UInt32, Int32, Ref{Ptr{Cvoid}}, Ref{Cint}),
          engine, id, writable, out_ptr, out_dtype)
pstar_param_unpin(engine, id) = ccall((:pstar_param_unpin, libpstar), Cint, (Ptr{Cvoid}, UInt32), engine, id)
pstar_checkpoint_save(engine, dir) =
    ccall((:pstar_checkpoint_save, libpstar), Cint, (Ptr{Cvoid}, Cstring), engine, dir)
pstar_checkpoint_load(engine, dir) =
    ccall((:pstar_checkpoint_load, libpstar), Cint, (Ptr{Cvoid}, Cstring), engine, dir)
pstar_export_safetensors(engine, path) =
    ccall((:pstar_export_safetensors, libpstar), Cint, (Ptr{Cvoid}, Cstring), engine, path)
pstar_iteration_begin(engine, kind) =
    ccall((:pstar_iteration_begin, libpstar), Cint, (Ptr{Cvoid}, Cint), engine, kind)
pstar_iteration_end(engine) = ccall((:pstar_iteration_end, libpstar), Cint, (Ptr{Cvoid},), engine)
pstar_iteration_abort(engine) = ccall((:pstar_iteration_abort, libpstar), Cint, (Ptr{Cvoid},), engine)
pstar_engine_compute_stream(engine, out_stream) =
    ccall((:pstar_engine_compute_stream, libpstar), Cint, (Ptr{Cvoid}, Ref{Ptr{Cvoid}}), engine, out_stream)
pstar_param_acquire(engine, id, stage, stream, out_ptr) =
    ccall((:pstar_param_acquire, libpstar), Cint, (Ptr{Cvoid}, UInt32, Cint, Ptr{Cvoid}, Ref{Ptr{Cvoid}}),
          engine, id, stage, stream, out_ptr)
pstar_param_release(engine, id, stream) =
    ccall((:pstar_param_release, libpstar), Cint, (Ptr{Cvoid}, UInt32, Ptr{Cvoid}), engine, id, stream)
pstar_grad_write(engine, id, grad, count, dtype, space, stream) =
    ccall((:pstar_grad_write, libpstar), Cint, (Ptr{Cvoid}, UInt32, Ptr{Cvoid}, UInt64, Cint, Cint, Ptr{Cvoid}),
          engine, id, grad, count, dtype, space, stream)
pstar_grad_write_release(engine, id, grad, count, dtype, space, stream) =
    ccall((:pstar_grad_write_release, libpstar), Cint,
          (Ptr{Cvoid}, UInt32, Ptr{Cvoid}, UInt64, Cint, Cint, Ptr{Cvoid}), engine, id, grad, count, dtype, space, stream)
pstar_grad_slot_acquire(engine, id, stream, out_ptr) =
    ccall((:pstar_grad_slot_acquire, libpstar), Cint, (Ptr{Cvoid}, UInt32, Ptr{Cvoid}, Ref{Ptr{Float32}}),
          engine, id, stream, out_ptr)
pstar_clock_advance(engine, seconds) =
    ccall((:pstar_clock_advance, libpstar), Cint, (Ptr{Cvoid}, Float64), engine, seconds)
pstar_clock_now(engine, out_seconds) =
    ccall((:pstar_clock_now, libpstar), Cint, (Ptr{Cvoid}, Ref{Float64}), engine, out_seconds)
pstar_trace_export(engine, path) =
    ccall((:pstar_trace_export, libpstar), Cint, (Ptr{Cvoid}, Cstring), engine, path)
pstar_nonmodel_report(engine, bytes) =
    ccall((:pstar_nonmodel_report, libpstar), Cint, (Ptr{Cvoid}, UInt64), engine, bytes)
pstar_step_result_init(result) = ccall((:pstar_step_result_init, libpstar), Cint, (Ref{StepResult},), result)
pstar_step(engine, result) = ccall((:pstar_step, libpstar), Cint, (Ptr{Cvoid}, Ref{StepResult}), engine, result)
pstar_hparam_set(engine, which, value) =
    ccall((:pstar_hparam_set, libpstar), Cint, (Ptr{Cvoid}, Cint, Float64), engine, which, value)
pstar_grad_norm(engine, out_norm) =
    ccall((:pstar_grad_norm, libpstar), Cint, (Ptr{Cvoid}, Ref{Float64}), engine, out_norm)
pstar_hparam_get(engine, which, out_value) =
    ccall((:pstar_hparam_get, libpstar), Cint, (Ptr{Cvoid}, Cint, Ref{Float64}), engine, which, out_value)
pstar_stats_init(stats) = ccall((:pstar_stats_init, libpstar), Cint, (Ref{Stats},), stats)
pstar_engine_get_stats(engine, stats) =
    ccall((:pstar_engine_get_stats, libpstar), Cint, (Ptr{Cvoid}, Ref{Stats}), engine, stats)

# ---------------------------------------------------------------------------
# Errors

"""A failed libpstar call: the status, its C name, the library's message."""
struct PstarError <: Exception
    status::Cint
    name::String
    message::String
    call::String
end

Base.showerror(io::IO, e::PstarError) = print(io, e.call, ": ", e.name, ": ", e.message)

"""
    @check pstar_call(args...)

Calls a wrapper and throws a `PstarError` (status, name, last error message)
for any status but PSTAR_OK.
"""
macro check(call)
    fname = string(call.args[1])
    quote
        local st = $(esc(call))
        if st != PSTAR_OK
            throw(PstarError(st, unsafe_string(pstar_status_name(st)), unsafe_string(pstar_last_error_message()),
                             $fname))
        end
        nothing
    end
end

# ---------------------------------------------------------------------------
# The Julia layer

"""An engine; destroyed by its finalizer or by `close`."""
mutable struct Engine
    ptr::Ptr{Cvoid}
    compute_dtype::Cint
    function Engine(opts::EngineOptions)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        @check pstar_engine_create(opts, out)
        e = new(out[], opts.compute_dtype)
        finalizer(close, e)
        return e
    end
end

"""Options with the library's defaults, then the keyword fields."""
function options(; kwargs...)
    o = EngineOptions()
    @check pstar_engine_options_init(o)
    for (k, v) in kwargs
        setfield!(o, k, convert(fieldtype(EngineOptions, k), v))
    end
    return o
end

Engine(; kwargs...) = Engine(options(; kwargs...))

function Base.close(e::Engine)
    if e.ptr != C_NULL
        pstar_engine_destroy(e.ptr)
        e.ptr = C_NULL
    end
    nothing
end

"""Registers a parameter; returns its id."""
function register!(e::Engine, name::AbstractString, shape::Vector{Int64}; frozen::Bool = false)
    id = Ref{UInt32}(0)
    @check pstar_param_register(e.ptr, name, UInt32(length(shape)), shape,
                                UInt32(frozen ? PSTAR_PARAM_FROZEN : PSTAR_PARAM_DEFAULT), id)
    return id[]
end

build!(e::Engine) = @check pstar_engine_build(e.ptr)

write!(e::Engine, id::UInt32, values::Vector{Float32}) =
    @check pstar_param_write(e.ptr, id, values, UInt64(length(values)), PSTAR_DTYPE_F32)

function read(e::Engine, id::UInt32)
    n = Ref{UInt64}(0)
    @check pstar_param_numel(e.ptr, id, n)
    out = Vector{Float32}(undef, n[])
    @check pstar_param_read(e.ptr, id, out, n[], PSTAR_DTYPE_F32)
    return out
end

"""
    pin(e, id; writable = false) -> Vector{Float32}

The parameter's fp32 master in place (`unsafe_wrap`, no copy), valid until
`unpin!`; read-only by contract unless `writable` (outside iterations; the
writes reach the compute copy at `unpin!`).  A step that would update it
throws PstarError(PSTAR_ERR_BUSY) meanwhile.
"""
function pin(e::Engine, id::UInt32; writable::Bool = false)
    p = Ref{Ptr{Cvoid}}(C_NULL)
    dt = Ref{Cint}(0)
    @check pstar_param_pin(e.ptr, id, Int32(writable), p, dt)
    n = Ref{UInt64}(0)
    @check pstar_param_numel(e.ptr, id, n)
    return unsafe_wrap(Vector{Float32}, Ptr{Float32}(p[]), Int(n[]); own = false)
end

unpin!(e::Engine, id::UInt32) = @check pstar_param_unpin(e.ptr, id)

"""Saves a checkpoint into `dir` (see the C API); `load!` restores it."""
save(e::Engine, dir::AbstractString) = @check pstar_checkpoint_save(e.ptr, dir)
load!(e::Engine, dir::AbstractString) = @check pstar_checkpoint_load(e.ptr, dir)
export_safetensors(e::Engine, path::AbstractString) = @check pstar_export_safetensors(e.ptr, path)

begin_train!(e::Engine) = @check pstar_iteration_begin(e.ptr, PSTAR_ITERATION_TRAIN)

"""
    abort_iteration!(e)

Ends the current TRAIN or EVAL iteration without a step (pstar_iteration_abort):
releases what is still acquired and discards the iteration's gradients, as if it
had never begun.
"""
abort_iteration!(e::Engine) = @check pstar_iteration_abort(e.ptr)

"""
    acquire(e, id, stage) -> Vector{Float32} (a view of host memory)

On the emulated device with an f32 compute dtype the parameter's memory is
host memory: it is wrapped without a copy (`unsafe_wrap`); the array must
not be used after `release!`.
"""
function acquire(e::Engine, id::UInt32, stage::Cint)
    p = Ref{Ptr{Cvoid}}(C_NULL)
    @check pstar_param_acquire(e.ptr, id, stage, C_NULL, p)
    n = Ref{UInt64}(0)
    @check pstar_param_numel(e.ptr, id, n)
    return unsafe_wrap(Vector{Float32}, Ptr{Float32}(p[]), Int(n[]); own = false)
end

release!(e::Engine, id::UInt32) = @check pstar_param_release(e.ptr, id, C_NULL)

grad_write!(e::Engine, id::UInt32, grad::Vector{Float32}) =
    @check pstar_grad_write(e.ptr, id, grad, UInt64(length(grad)), PSTAR_DTYPE_F32, PSTAR_MEM_HOST, C_NULL)

function step!(e::Engine)
    r = StepResult()
    @check pstar_step_result_init(r)
    @check pstar_step(e.ptr, r)
    return r
end

function stats(e::Engine)
    s = Stats()
    @check pstar_stats_init(s)
    @check pstar_engine_get_stats(e.ptr, s)
    return s
end

export Engine, EngineOptions, PstarError, @check, options, register!, build!, write!, read, begin_train!,
       abort_iteration!, acquire, release!, grad_write!, step!, stats, pin, unpin!, save, load!, export_safetensors

end # module
