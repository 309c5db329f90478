//! libpstar for Rust: chunk-based memory management for training.
//!
//! ```no_run
//! use pstar::{Engine, Options, Stage};
//! let mut engine = Engine::new(&Options::new().chunk_elems(1024)).unwrap();
//! let w = engine.register("w", &[16, 16], false).unwrap();
//! engine.build().unwrap();
//! engine.write_f32(w, &[0.0; 256]).unwrap();
//! engine.begin_train().unwrap();
//! {
//!     let view = engine.acquire(w, Stage::Forward).unwrap();
//!     let _weights: &[f32] = view.as_f32().unwrap(); // host memory (emulated device)
//!     view.release().unwrap();
//! }
//! let view = engine.acquire(w, Stage::Backward).unwrap();
//! engine.grad_write_f32(w, &[0.1; 256]).unwrap();
//! view.release().unwrap();
//! engine.step().unwrap();
//! ```
//!
//! Every call returns `Result<T, pstar::Error>`; the error carries the status
//! code (an integer: codes added by a later library stay representable), its
//! C name and the library's message.  `Engine` destroys the C engine when
//! dropped.  The engine is not thread-safe, so `Engine` is neither `Send`
//! nor `Sync`.
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::c_void;

pub use pstar_sys as sys;

/// Status codes of the C API, as integers.
pub mod status {
    use pstar_sys as sys;
    pub const OK: i32 = sys::pstar_status_PSTAR_OK;
    pub const INVALID_ARGUMENT: i32 = sys::pstar_status_PSTAR_ERR_INVALID_ARGUMENT;
    pub const INVALID_HANDLE: i32 = sys::pstar_status_PSTAR_ERR_INVALID_HANDLE;
    pub const INVALID_STATE: i32 = sys::pstar_status_PSTAR_ERR_INVALID_STATE;
    pub const NOT_FOUND: i32 = sys::pstar_status_PSTAR_ERR_NOT_FOUND;
    pub const OUT_OF_MEMORY: i32 = sys::pstar_status_PSTAR_ERR_OUT_OF_MEMORY;
    pub const BUSY: i32 = sys::pstar_status_PSTAR_ERR_BUSY;
    pub const UNSUPPORTED: i32 = sys::pstar_status_PSTAR_ERR_UNSUPPORTED;
    pub const DEVICE: i32 = sys::pstar_status_PSTAR_ERR_DEVICE;
    pub const IO: i32 = sys::pstar_status_PSTAR_ERR_IO;
    pub const COMM: i32 = sys::pstar_status_PSTAR_ERR_COMM;
    pub const VERSION: i32 = sys::pstar_status_PSTAR_ERR_VERSION;
    pub const INTERNAL: i32 = sys::pstar_status_PSTAR_ERR_INTERNAL;
}

/// A failed call: the status, its C name ("PSTAR_ERR_BUSY"), the library's
/// message and the C function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: i32,
    pub name: String,
    pub message: String,
    pub call: &'static str,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.call, self.name, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn check(status: sys::pstar_status, call: &'static str) -> Result<()> {
    if status == status::OK {
        return Ok(());
    }
    Err(Error {
        status,
        name: cstr(unsafe { sys::pstar_status_name(status) }),
        message: cstr(unsafe { sys::pstar_last_error_message() }),
        call,
    })
}

/// The library's version string ("0.1.0").
pub fn version() -> String {
    cstr(unsafe { sys::pstar_version_string() })
}

/// The C name of a status code ("PSTAR_ERR_UNKNOWN" for one it does not know).
pub fn status_name(status: i32) -> String {
    cstr(unsafe { sys::pstar_status_name(status) })
}

/// Compute dtype of the chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    fn raw(self) -> sys::pstar_dtype {
        match self {
            Dtype::F32 => sys::pstar_dtype_PSTAR_DTYPE_F32,
            Dtype::F16 => sys::pstar_dtype_PSTAR_DTYPE_F16,
            Dtype::Bf16 => sys::pstar_dtype_PSTAR_DTYPE_BF16,
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            _ => 2,
        }
    }
}

/// The format of Adam's moments (pstar_state_format): fp32 (the default),
/// bf16, or blockwise 8-bit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFormat {
    Fp32,
    Bf16,
    Int8,
}

impl StateFormat {
    fn raw(self) -> sys::pstar_state_format {
        match self {
            StateFormat::Fp32 => sys::pstar_state_format_PSTAR_STATE_FP32,
            StateFormat::Bf16 => sys::pstar_state_format_PSTAR_STATE_BF16,
            StateFormat::Int8 => sys::pstar_state_format_PSTAR_STATE_INT8,
        }
    }
}

/// The format of the master weights (pstar_master_format): fp32 (the
/// default), or bf16 rounded stochastically after each update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasterFormat {
    Fp32,
    Bf16,
}

impl MasterFormat {
    fn raw(self) -> sys::pstar_master_format {
        match self {
            MasterFormat::Fp32 => sys::pstar_master_format_PSTAR_MASTER_FP32,
            MasterFormat::Bf16 => sys::pstar_master_format_PSTAR_MASTER_BF16,
        }
    }
}

/// The accelerator tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// Host memory posing as a device (no GPU needed).
    Emulated,
    /// A CUDA device, by ordinal.
    Cuda(i32),
}

/// Stage of a parameter use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Forward,
    Backward,
    Recompute,
}

impl Stage {
    fn raw(self) -> sys::pstar_stage {
        match self {
            Stage::Forward => sys::pstar_stage_PSTAR_STAGE_FORWARD,
            Stage::Backward => sys::pstar_stage_PSTAR_STAGE_BACKWARD,
            Stage::Recompute => sys::pstar_stage_PSTAR_STAGE_RECOMPUTE,
        }
    }
}

/// Engine options: the library's defaults (pstar_engine_options_init), set
/// through builder methods or `raw_mut()` for any field.
#[derive(Clone)]
pub struct Options {
    raw: sys::pstar_engine_options,
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

impl Options {
    pub fn new() -> Options {
        let mut raw: sys::pstar_engine_options = unsafe { std::mem::zeroed() };
        // Cannot fail on a valid pointer.
        unsafe { sys::pstar_engine_options_init(&mut raw) };
        Options { raw }
    }
    pub fn device(mut self, device: Device) -> Self {
        match device {
            Device::Emulated => self.raw.device = sys::pstar_device_kind_PSTAR_DEVICE_EMULATED,
            Device::Cuda(ordinal) => {
                self.raw.device = sys::pstar_device_kind_PSTAR_DEVICE_CUDA;
                self.raw.device_ordinal = ordinal;
            }
        }
        self
    }
    /// Bytes of accelerator memory the engine may use (0: unlimited on the
    /// emulated device, all free memory on CUDA).
    pub fn device_capacity(mut self, bytes: u64) -> Self {
        self.raw.device_capacity_bytes = bytes;
        self
    }
    pub fn chunk_elems(mut self, elems: u64) -> Self {
        self.raw.chunk_elems = elems;
        self
    }
    pub fn compute_dtype(mut self, dtype: Dtype) -> Self {
        self.raw.compute_dtype = dtype.raw();
        self
    }
    pub fn lr(mut self, lr: f32) -> Self {
        self.raw.lr = lr;
        self
    }
    pub fn weight_decay(mut self, wd: f32) -> Self {
        self.raw.weight_decay = wd;
        self
    }
    /// The format of Adam's moments, fixed for the engine's life.
    pub fn state_format(mut self, format: StateFormat) -> Self {
        self.raw.state_format = format.raw();
        self
    }
    /// The format of the master weights, fixed for the engine's life; `seed`
    /// picks bf16 masters' stochastic rounding bits.
    pub fn master_format(mut self, format: MasterFormat, seed: u64) -> Self {
        self.raw.master_format = format.raw();
        self.raw.master_seed = seed;
        self
    }
    /// Every field of pstar_engine_options.
    pub fn raw_mut(&mut self) -> &mut sys::pstar_engine_options {
        &mut self.raw
    }
}

/// A registered parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub id: u32,
    pub numel: u64,
}

/// What a step did.
#[derive(Debug, Clone, Copy)]
pub struct StepResult {
    pub step: u64,
    pub skipped: bool,
    pub params_updated: u32,
    pub grad_norm: f64,
    pub loss_scale: f32,
}

/// A libpstar engine; destroyed when dropped.
pub struct Engine {
    raw: *mut sys::pstar_engine,
    dtype: Dtype,
    host_memory: bool,
}

impl Drop for Engine {
    fn drop(&mut self) {
        unsafe { sys::pstar_engine_destroy(self.raw) };
    }
}

impl Engine {
    pub fn new(options: &Options) -> Result<Engine> {
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::pstar_engine_create(&options.raw, &mut raw) }, "pstar_engine_create")?;
        let dtype = match options.raw.compute_dtype {
            d if d == sys::pstar_dtype_PSTAR_DTYPE_F32 => Dtype::F32,
            d if d == sys::pstar_dtype_PSTAR_DTYPE_F16 => Dtype::F16,
            _ => Dtype::Bf16,
        };
        let host_memory = options.raw.device == sys::pstar_device_kind_PSTAR_DEVICE_EMULATED;
        Ok(Engine { raw, dtype, host_memory })
    }

    pub fn compute_dtype(&self) -> Dtype {
        self.dtype
    }

    /// The C handle, for calls the safe API does not cover.
    pub fn raw_handle(&self) -> *mut sys::pstar_engine {
        self.raw
    }

    pub fn register(&mut self, name: &str, shape: &[i64], frozen: bool) -> Result<Param> {
        let cname = CString::new(name).map_err(|_| Error {
            status: status::INVALID_ARGUMENT,
            name: status_name(status::INVALID_ARGUMENT),
            message: format!("parameter name {:?} contains a NUL byte", name),
            call: "pstar_param_register",
        })?;
        let flags = if frozen { sys::pstar_param_flags_PSTAR_PARAM_FROZEN as u32 } else { 0 };
        let mut id = 0u32;
        check(
            unsafe {
                sys::pstar_param_register(self.raw, cname.as_ptr(), shape.len() as u32, shape.as_ptr(), flags, &mut id)
            },
            "pstar_param_register",
        )?;
        let numel = shape.iter().product::<i64>().max(0) as u64;
        Ok(Param { id, numel })
    }

    pub fn build(&mut self) -> Result<()> {
        check(unsafe { sys::pstar_engine_build(self.raw) }, "pstar_engine_build")
    }

    pub fn find(&self, name: &str) -> Result<Param> {
        let cname = CString::new(name).unwrap_or_default();
        let mut id = 0u32;
        check(unsafe { sys::pstar_param_find(self.raw, cname.as_ptr(), &mut id) }, "pstar_param_find")?;
        let mut numel = 0u64;
        check(unsafe { sys::pstar_param_numel(self.raw, id, &mut numel) }, "pstar_param_numel")?;
        Ok(Param { id, numel })
    }

    /// Writes the values (the library checks the count).
    pub fn write_f32(&mut self, p: Param, values: &[f32]) -> Result<()> {
        check(
            unsafe {
                sys::pstar_param_write(self.raw, p.id, values.as_ptr() as *const c_void, values.len() as u64,
                                       sys::pstar_dtype_PSTAR_DTYPE_F32)
            },
            "pstar_param_write",
        )
    }

    /// Reads the values (the library checks the count).
    pub fn read_f32(&mut self, p: Param, out: &mut [f32]) -> Result<()> {
        check(
            unsafe {
                sys::pstar_param_read(self.raw, p.id, out.as_mut_ptr() as *mut c_void, out.len() as u64,
                                      sys::pstar_dtype_PSTAR_DTYPE_F32)
            },
            "pstar_param_read",
        )
    }

    /// The parameter's fp32 master in place (pstar_param_pin), read-only;
    /// unpinned when the guard is dropped (or by `unpin`, with its status).
    /// While pinned, a step that would update it fails with BUSY.
    pub fn pin(&self, p: Param) -> Result<Pinned<'_>> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let mut dtype: sys::pstar_dtype = 0;
        check(unsafe { sys::pstar_param_pin(self.raw, p.id, 0, &mut ptr, &mut dtype) }, "pstar_param_pin")?;
        Ok(Pinned { engine: self, param: p, ptr: ptr as *const f32, unpinned: false })
    }

    /// A writable pin of the fp32 master (outside iterations): the writes
    /// reach the compute copy when the guard is dropped or `unpin`ned.
    pub fn pin_mut(&mut self, p: Param) -> Result<PinnedMut<'_>> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let mut dtype: sys::pstar_dtype = 0;
        check(unsafe { sys::pstar_param_pin(self.raw, p.id, 1, &mut ptr, &mut dtype) }, "pstar_param_pin")?;
        Ok(PinnedMut { engine: self, param: p, ptr: ptr as *mut f32, unpinned: false })
    }

    /// Saves a checkpoint into `dir` (pstar_checkpoint_save).
    pub fn save_checkpoint(&mut self, dir: &str) -> Result<()> {
        let c = CString::new(dir).unwrap_or_default();
        check(unsafe { sys::pstar_checkpoint_save(self.raw, c.as_ptr()) }, "pstar_checkpoint_save")
    }

    /// Loads the checkpoint `dir`/LATEST names (pstar_checkpoint_load).
    pub fn load_checkpoint(&mut self, dir: &str) -> Result<()> {
        let c = CString::new(dir).unwrap_or_default();
        check(unsafe { sys::pstar_checkpoint_load(self.raw, c.as_ptr()) }, "pstar_checkpoint_load")
    }

    /// Writes every parameter's fp32 values as a safetensors file.
    pub fn export_safetensors(&mut self, path: &str) -> Result<()> {
        let c = CString::new(path).unwrap_or_default();
        check(unsafe { sys::pstar_export_safetensors(self.raw, c.as_ptr()) }, "pstar_export_safetensors")
    }

    pub fn begin_train(&mut self) -> Result<()> {
        check(unsafe { sys::pstar_iteration_begin(self.raw, sys::pstar_iteration_kind_PSTAR_ITERATION_TRAIN) },
              "pstar_iteration_begin")
    }

    pub fn begin_eval(&mut self) -> Result<()> {
        check(unsafe { sys::pstar_iteration_begin(self.raw, sys::pstar_iteration_kind_PSTAR_ITERATION_EVAL) },
              "pstar_iteration_begin")
    }

    pub fn end_iteration(&mut self) -> Result<()> {
        check(unsafe { sys::pstar_iteration_end(self.raw) }, "pstar_iteration_end")
    }

    /// Ends the current TRAIN or EVAL iteration without a step
    /// (`pstar_iteration_abort`): releases what is still acquired (a View
    /// leaked with `std::mem::forget`; Views dropped on the way here have
    /// released themselves), discards the iteration's gradients and use
    /// counts, and leaves the parameters, the optimizer state, the step
    /// count, the loss scale and the trace as if the iteration had never
    /// begun.  `INVALID_STATE` without an iteration; `UNSUPPORTED` with a
    /// data-parallel group (world size > 1).
    pub fn abort_iteration(&mut self) -> Result<()> {
        check(unsafe { sys::pstar_iteration_abort(self.raw) }, "pstar_iteration_abort")
    }

    /// Acquires a parameter for a use; the View releases it when dropped
    /// (or explicitly, with its status, through `release`).
    pub fn acquire(&self, p: Param, stage: Stage) -> Result<View<'_>> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        check(unsafe { sys::pstar_param_acquire(self.raw, p.id, stage.raw(), std::ptr::null_mut(), &mut ptr) },
              "pstar_param_acquire")?;
        Ok(View { engine: self, param: p, ptr, released: false })
    }

    /// Adds a gradient (between the backward acquire and its release).
    pub fn grad_write_f32(&self, p: Param, grad: &[f32]) -> Result<()> {
        check(
            unsafe {
                sys::pstar_grad_write(self.raw, p.id, grad.as_ptr() as *const c_void, grad.len() as u64,
                                      sys::pstar_dtype_PSTAR_DTYPE_F32, sys::pstar_mem_space_PSTAR_MEM_HOST,
                                      std::ptr::null_mut())
            },
            "pstar_grad_write",
        )
    }

    /// This TRAIN iteration's global gradient norm, unscaled, once its
    /// backward is complete: the value the step will report (pstar_grad_norm).
    pub fn grad_norm(&mut self) -> Result<f64> {
        let mut norm = 0.0f64;
        check(unsafe { sys::pstar_grad_norm(self.raw, &mut norm) }, "pstar_grad_norm")?;
        Ok(norm)
    }

    /// Ends the TRAIN iteration with Adam.
    pub fn step(&mut self) -> Result<StepResult> {
        let mut r: sys::pstar_step_result = unsafe { std::mem::zeroed() };
        check(unsafe { sys::pstar_step_result_init(&mut r) }, "pstar_step_result_init")?;
        check(unsafe { sys::pstar_step(self.raw, &mut r) }, "pstar_step")?;
        Ok(StepResult {
            step: r.step,
            skipped: r.skipped != 0,
            params_updated: r.params_updated,
            grad_norm: r.grad_norm,
            loss_scale: r.loss_scale,
        })
    }

    pub fn stats(&self) -> Result<sys::pstar_stats> {
        let mut s: sys::pstar_stats = unsafe { std::mem::zeroed() };
        check(unsafe { sys::pstar_stats_init(&mut s) }, "pstar_stats_init")?;
        check(unsafe { sys::pstar_engine_get_stats(self.raw, &mut s) }, "pstar_engine_get_stats")?;
        Ok(s)
    }
}

/// An acquired parameter: its memory until released.
pub struct View<'a> {
    engine: &'a Engine,
    param: Param,
    ptr: *mut c_void,
    released: bool,
}

impl<'a> View<'a> {
    /// The address of the parameter's memory (device memory on CUDA).
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr
    }

    /// The values as f32, where they are host memory (the emulated device)
    /// and the compute dtype is f32; None otherwise.
    pub fn as_f32(&self) -> Option<&[f32]> {
        if !self.engine.host_memory || self.engine.dtype != Dtype::F32 || self.ptr.is_null() {
            return None;
        }
        Some(unsafe { std::slice::from_raw_parts(self.ptr as *const f32, self.param.numel as usize) })
    }

    /// The raw 16-bit elements (f16 or bf16 bits) in host memory; None
    /// otherwise.
    pub fn as_u16(&self) -> Option<&[u16]> {
        if !self.engine.host_memory || self.engine.dtype == Dtype::F32 || self.ptr.is_null() {
            return None;
        }
        Some(unsafe { std::slice::from_raw_parts(self.ptr as *const u16, self.param.numel as usize) })
    }

    /// Releases the parameter and reports the status.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        check(unsafe { sys::pstar_param_release(self.engine.raw, self.param.id, std::ptr::null_mut()) },
              "pstar_param_release")
    }
}

impl<'a> Drop for View<'a> {
    fn drop(&mut self) {
        if !self.released {
            // A drop cannot report: the status is dropped with it.  Call
            // release() to see it.
            unsafe { sys::pstar_param_release(self.engine.raw, self.param.id, std::ptr::null_mut()) };
        }
    }
}

/// A pinned fp32 master (see `Engine::pin`).
pub struct Pinned<'a> {
    engine: &'a Engine,
    param: Param,
    ptr: *const f32,
    unpinned: bool,
}

impl<'a> Pinned<'a> {
    /// The master values, in place.
    pub fn as_slice(&self) -> &[f32] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.param.numel as usize) }
    }

    /// Unpins and reports the status.
    pub fn unpin(mut self) -> Result<()> {
        self.unpinned = true;
        check(unsafe { sys::pstar_param_unpin(self.engine.raw, self.param.id) }, "pstar_param_unpin")
    }
}

impl<'a> Drop for Pinned<'a> {
    fn drop(&mut self) {
        if !self.unpinned {
            unsafe { sys::pstar_param_unpin(self.engine.raw, self.param.id) };
        }
    }
}

/// A writable pin of a master (see `Engine::pin_mut`).
pub struct PinnedMut<'a> {
    engine: &'a mut Engine,
    param: Param,
    ptr: *mut f32,
    unpinned: bool,
}

impl<'a> PinnedMut<'a> {
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.param.numel as usize) }
    }

    /// Unpins (the compute copy takes the writes) and reports the status.
    pub fn unpin(mut self) -> Result<()> {
        self.unpinned = true;
        check(unsafe { sys::pstar_param_unpin(self.engine.raw, self.param.id) }, "pstar_param_unpin")
    }
}

impl<'a> Drop for PinnedMut<'a> {
    fn drop(&mut self) {
        if !self.unpinned {
            unsafe { sys::pstar_param_unpin(self.engine.raw, self.param.id) };
        }
    }
}
