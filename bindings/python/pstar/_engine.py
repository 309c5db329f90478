"""The Pythonic layer over pstar.capi: Options, Engine, Param, View."""
import contextlib
import ctypes
import weakref
from dataclasses import dataclass

from . import capi as _c
from . import _dlpack
from ._errors import (BusyError, InvalidArgumentError, InvalidStateError, UnsupportedError, check)

# Names accepted for the enums (integers are accepted too).
_DEVICES = {"emulated": _c.PSTAR_DEVICE_EMULATED, "cuda": _c.PSTAR_DEVICE_CUDA}
_DTYPES = {"bf16": _c.PSTAR_DTYPE_BF16, "f16": _c.PSTAR_DTYPE_F16, "f32": _c.PSTAR_DTYPE_F32}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_ELEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4}
# memoryview/struct format of each dtype: bf16 has none, so its raw 16 bits.
_FORMATS = {"bf16": "H", "f16": "e", "f32": "f"}
_FORMAT_DTYPES = {"e": "f16", "f": "f32"}
_STAGES = {
    "forward": _c.PSTAR_STAGE_FORWARD,
    "backward": _c.PSTAR_STAGE_BACKWARD,
    "recompute": _c.PSTAR_STAGE_RECOMPUTE,
}
_POLICIES = {"opt": _c.PSTAR_POLICY_OPT, "lru": _c.PSTAR_POLICY_LRU, "static": _c.PSTAR_POLICY_STATIC}
_STATE_FORMATS = {"fp32": _c.PSTAR_STATE_FP32, "bf16": _c.PSTAR_STATE_BF16, "int8": _c.PSTAR_STATE_INT8}
_MASTER_FORMATS = {"fp32": _c.PSTAR_MASTER_FP32, "bf16": _c.PSTAR_MASTER_BF16}
_HPARAMS = {
    "lr": _c.PSTAR_HPARAM_LR,
    "beta1": _c.PSTAR_HPARAM_BETA1,
    "beta2": _c.PSTAR_HPARAM_BETA2,
    "eps": _c.PSTAR_HPARAM_EPS,
    "weight_decay": _c.PSTAR_HPARAM_WEIGHT_DECAY,
    "clip_norm": _c.PSTAR_HPARAM_CLIP_NORM,
    "loss_scale": _c.PSTAR_HPARAM_LOSS_SCALE,
    "step": _c.PSTAR_HPARAM_STEP,
}


def _raise(cls, status_name: str, message: str, call: str = ""):
    raise cls(getattr(_c, status_name), status_name, message, call)


def _enum(value, names, what):
    if isinstance(value, str):
        try:
            return names[value.lower()]
        except KeyError:
            _raise(InvalidArgumentError, "PSTAR_ERR_INVALID_ARGUMENT", f"{what}: {value!r} is not one of {sorted(names)}")
    return int(value)


def _dtype_name(value) -> str:
    return _DTYPE_NAMES[_enum(value, _DTYPES, "dtype")]


class Options:
    """pstar_engine_options with the library's defaults; fields by name.

    ``Options(device="emulated", device_capacity_bytes=1 << 20, compute_dtype="bf16")``;
    enum fields take names ("cuda", "f16", "lru", state_format "int8", master_format "bf16") or integers, and
    ``chunk_elems="auto"`` is PSTAR_CHUNK_ELEMS_AUTO (the build sizes the chunks to the parameters).  An unknown
    field name raises TypeError.
    """

    _ENUMS = {
        "device": _DEVICES,
        "compute_dtype": _DTYPES,
        "placement_policy": _POLICIES,
        "state_format": _STATE_FORMATS,
        "master_format": _MASTER_FORMATS,
    }

    def __init__(self, **fields):
        self._raw = _c.pstar_engine_options()
        check(_c.pstar_engine_options_init(self._raw), "pstar_engine_options_init")
        for name, value in fields.items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        if name == "_raw":
            object.__setattr__(self, name, value)
            return
        if name in ("size", "version") or not hasattr(self._raw, name):
            raise TypeError(f"Options: no field {name!r}")
        if name in self._ENUMS:
            value = _enum(value, self._ENUMS[name], name)
        elif name == "chunk_elems" and value == "auto":
            value = _c.PSTAR_CHUNK_ELEMS_AUTO
        setattr(self._raw, name, value)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._raw, name)


@dataclass(frozen=True)
class StepResult:
    """What a step did (pstar_step_result)."""

    step: int
    skipped: bool
    params_updated: int
    grad_norm: float
    loss_scale: float
    next_loss_scale: float
    clip_coef: float


class Param:
    """A registered parameter: its id, name, shape and element count."""

    def __init__(self, engine, pid: int, name: str, shape):
        # Weak: the engine keeps its Params, and a cycle would leave the
        # engine (and its memory) to the garbage collector.
        self._engine = weakref.ref(engine)
        self.id = pid
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        n = 1
        for d in self.shape:
            n *= d
        self.numel = n

    @property
    def engine(self):
        return self._engine()

    def __repr__(self):
        return f"Param({self.name!r}, shape={self.shape})"


class View:
    """An acquired parameter's memory, valid until released.

    Exports: ``memoryview()`` (the buffer protocol; host memory only: the
    emulated device), ``__dlpack__``/``__dlpack_device__`` (DLPack: NumPy's
    and PyTorch's ``from_dlpack``), read-only unless the view was acquired
    writable.  ``release()`` (or leaving the ``with`` block) refuses with
    BusyError while a DLPack export is not freed by its consumer: drop the
    tensors made from it first.
    """

    def __init__(self, engine, param: Param, address: int, stage: str, writable: bool, stream):
        self.engine = engine
        self.param = param
        self.address = address
        self.stage = stage
        self.writable = writable
        self.stream = stream
        self.dtype = engine.compute_dtype
        self.released = False
        self._exports = 0

    @property
    def nbytes(self) -> int:
        return self.param.numel * _ELEM_BYTES[self.dtype]

    def _check_live(self):
        if self.released:
            _raise(InvalidStateError, "PSTAR_ERR_INVALID_STATE", f"view of {self.param.name!r}: already released")

    def memoryview(self) -> memoryview:
        """The memory through the buffer protocol (emulated device only).

        bf16 has no buffer-protocol format: its elements appear as 16-bit
        unsigned integers ("H").
        """
        self._check_live()
        if self.engine.device != "emulated":
            _raise(UnsupportedError, "PSTAR_ERR_UNSUPPORTED", "memoryview: device memory is not host memory; use DLPack")
        raw = (ctypes.c_char * self.nbytes).from_address(self.address)
        mv = memoryview(raw).cast("B").cast(_FORMATS[self.dtype], self.param.shape or (1,))
        return mv if self.writable else mv.toreadonly()

    def __dlpack_device__(self):
        if self.engine.device == "emulated":
            return (_dlpack.KDL_CPU, 0)
        return (_dlpack.KDL_CUDA, self.engine.options.device_ordinal)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self._check_live()
        if copy:
            raise BufferError("pstar: DLPack export never copies (copy=True refused)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"pstar: the memory is on {self.__dlpack_device__()}, not {tuple(dl_device)}")
        versioned = max_version is not None and max_version[0] >= 1
        if self.engine.device != "emulated":
            self._order_for_consumer(stream)
        self._exports += 1
        self.engine._exports += 1

        def on_free():
            self._exports -= 1
            self.engine._exports -= 1

        return _dlpack.make_capsule(self.address, self.param.shape, self.dtype, self.__dlpack_device__(),
                                    read_only=not self.writable, versioned=versioned, on_free=on_free)

    def _order_for_consumer(self, stream):
        """DLPack's stream argument on CUDA: the data is ready for work the
        consumer queues on `stream` (None or 1: the legacy default stream,
        2: the per-thread default stream, -1: the consumer orders it
        itself).  It is ready on the stream the view was acquired for; a
        different consumer stream waits for an event recorded there (through
        torch.cuda, the only CUDA runtime Python has here; without torch a
        different stream is refused).  Not run on a GPU yet."""
        if stream == -1:
            return
        producer = self.stream or 0
        consumer = 0 if stream in (None, 1) else stream
        if consumer == producer:
            return
        try:
            import torch
        except ImportError:
            raise BufferError(f"pstar: the view was acquired for stream {producer:#x}; ordering consumer stream "
                              f"{consumer:#x} after it needs torch.cuda") from None
        device = self.engine.options.device_ordinal

        def wrap(handle):  # 0: the legacy default stream; else a cudaStream_t (2: per-thread default)
            return torch.cuda.default_stream(device) if handle == 0 else torch.cuda.ExternalStream(handle, device)

        ev = torch.cuda.Event()
        ev.record(wrap(producer))
        wrap(consumer).wait_event(ev)

    def release(self):
        """Releases the parameter (pstar_param_release)."""
        if self.released:
            return
        if self._exports:
            _raise(BusyError, "PSTAR_ERR_BUSY",
                   f"{self._exports} DLPack export(s) of {self.param.name!r} not freed by their consumer",
                   self._release_call)
        self._release_now()
        self.released = True

    _release_call = "pstar_param_release"

    def _release_now(self):
        check(_c.pstar_param_release(self.engine._handle(), self.param.id, self.stream), "pstar_param_release")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


class PinnedMaster(View):
    """A parameter's fp32 master in host memory, without a copy
    (pstar_param_pin), read-only unless pinned writable (outside iterations;
    the writes reach the compute copy at unpin), valid until ``unpin()`` (or
    the end of its ``with`` block).  While pinned, a step that would update the parameter
    raises BusyError; ``unpin()`` raises BusyError while a DLPack export of
    it is alive."""

    _release_call = "pstar_param_unpin"

    def __init__(self, engine, param, address, writable=False):
        super().__init__(engine, param, address, "pin", writable, None)
        self.dtype = "f32"

    def memoryview(self) -> memoryview:
        self._check_live()
        raw = (ctypes.c_char * self.nbytes).from_address(self.address)
        mv = memoryview(raw).cast("B").cast("f", self.param.shape or (1,))
        return mv if self.writable else mv.toreadonly()

    def __dlpack_device__(self):
        return (_dlpack.KDL_CPU, 0)

    def _release_now(self):
        check(_c.pstar_param_unpin(self.engine._handle(), self.param.id), "pstar_param_unpin")

    unpin = View.release


class Engine:
    """A libpstar engine (pstar_engine_create), usable as a context manager.

    ``Engine(Options(...))`` or ``Engine(device="emulated", ...)``.  Every
    failing call raises a PstarError subclass with the status and message.
    """

    def __init__(self, options: Options = None, **fields):
        if options is None:
            options = Options(**fields)
        elif fields:
            raise TypeError("Engine: pass an Options or fields, not both")
        self.options = options
        self._exports = 0
        self._closed = False
        self._engine = None
        self._engine = check(_c.pstar_engine_create(options._raw), "pstar_engine_create")
        self.compute_dtype = _dtype_name(options.compute_dtype)
        self.device = "emulated" if options.device == _c.PSTAR_DEVICE_EMULATED else "cuda"
        self._params = {}

    # -- lifetime --------------------------------------------------------
    def _handle(self):
        # After close() the destroyed handle is still passed on: the C API
        # answers PSTAR_ERR_INVALID_HANDLE for it (it keeps a set of live
        # engines), and that is the error the caller gets.
        return self._engine

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self):
        """Destroys the engine (idempotent); refused while DLPack exports live."""
        if self._closed or self._engine is None:
            return
        if self._exports:
            _raise(BusyError, "PSTAR_ERR_BUSY", f"{self._exports} DLPack export(s) not freed by their consumer",
                   "pstar_engine_destroy")
        self._closed = True
        check(_c.pstar_engine_destroy(self._engine), "pstar_engine_destroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if getattr(self, "_engine", None) is not None and not self._closed and not self._exports:
            self._closed = True
            _c.pstar_engine_destroy(self._engine)

    # -- parameters ------------------------------------------------------
    def register(self, name: str, shape, frozen: bool = False, no_weight_decay: bool = False) -> Param:
        flags = (_c.PSTAR_PARAM_FROZEN if frozen else 0) | (_c.PSTAR_PARAM_NO_WEIGHT_DECAY if no_weight_decay else 0)
        shape = [int(d) for d in shape]
        pid = check(_c.pstar_param_register(self._handle(), name, shape, flags), "pstar_param_register")
        p = Param(self, pid, name, shape)
        self._params[name] = p
        return p

    def build(self):
        check(_c.pstar_engine_build(self._handle()), "pstar_engine_build")

    def param(self, name: str) -> Param:
        """The registered parameter `name` (NotFoundError if none)."""
        pid = check(_c.pstar_param_find(self._handle(), name), "pstar_param_find")
        return self._params.get(name) or Param(self, pid, name, (self.numel(pid),))

    def numel(self, pid: int) -> int:
        return check(_c.pstar_param_numel(self._handle(), pid), "pstar_param_numel")

    @property
    def param_count(self) -> int:
        return check(_c.pstar_param_count(self._handle()), "pstar_param_count")

    def write(self, param: Param, values, dtype: str = None):
        """Writes a parameter's values from a C-contiguous buffer (NumPy array,
        array.array, bytes...) of `dtype` (default: from the buffer's format,
        f32 for "f", f16 for "e"; bf16 must be named)."""
        mv = memoryview(values)
        dtype = self._buffer_dtype(mv, dtype, "write")
        self._check_count(param, mv, dtype, "write")
        check(_c.pstar_param_write(self._handle(), param.id, values, param.numel, _DTYPES[dtype]), "pstar_param_write")

    def read(self, param: Param, out=None, dtype: str = "f32"):
        """Reads a parameter's values into `out` (a writable buffer of `dtype`),
        or into a new NumPy array (f32 or f16) when `out` is None."""
        if out is None:
            import numpy
            if dtype == "bf16":
                out = numpy.empty(param.shape, dtype=numpy.uint16)
            else:
                out = numpy.empty(param.shape, dtype={"f32": numpy.float32, "f16": numpy.float16}[dtype])
        mv = memoryview(out)
        if mv.readonly:
            _raise(InvalidArgumentError, "PSTAR_ERR_INVALID_ARGUMENT", "read: out is read-only", "pstar_param_read")
        self._check_count(param, mv, dtype, "read")
        check(_c.pstar_param_read(self._handle(), param.id, out, param.numel, _DTYPES[dtype]), "pstar_param_read")
        return out

    def pin(self, param: Param, writable: bool = False) -> PinnedMaster:
        """The parameter's fp32 master in place (pstar_param_pin)."""
        address, _dtype = check(_c.pstar_param_pin(self._handle(), param.id, 1 if writable else 0),
                                "pstar_param_pin")
        return PinnedMaster(self, param, address, writable)

    def save_checkpoint(self, directory: str):
        """Saves a checkpoint into `directory` (pstar_checkpoint_save)."""
        check(_c.pstar_checkpoint_save(self._handle(), str(directory)), "pstar_checkpoint_save")

    def load_checkpoint(self, directory: str):
        """Loads the checkpoint `directory`/LATEST names (pstar_checkpoint_load)."""
        check(_c.pstar_checkpoint_load(self._handle(), str(directory)), "pstar_checkpoint_load")

    def export_safetensors(self, path: str):
        """Writes every parameter's fp32 values as a safetensors file."""
        check(_c.pstar_export_safetensors(self._handle(), str(path)), "pstar_export_safetensors")

    def set_lr_scale(self, param: Param, scale: float):
        check(_c.pstar_param_set_lr_scale(self._handle(), param.id, float(scale)), "pstar_param_set_lr_scale")

    def set_weight_decay(self, param: Param, enabled: bool):
        check(_c.pstar_param_set_weight_decay(self._handle(), param.id, 1 if enabled else 0),
              "pstar_param_set_weight_decay")

    @staticmethod
    def _buffer_dtype(mv: memoryview, dtype, call):
        if dtype is not None:
            return _dtype_name(dtype)
        fmt = mv.format.lstrip("@=<")
        if fmt not in _FORMAT_DTYPES:
            _raise(InvalidArgumentError, "PSTAR_ERR_INVALID_ARGUMENT",
                   f"{call}: buffer format {mv.format!r}: name the dtype (bf16 needs it)")
        return _FORMAT_DTYPES[fmt]

    @staticmethod
    def _check_count(param: Param, mv: memoryview, dtype: str, call: str):
        if mv.nbytes != param.numel * _ELEM_BYTES[dtype]:
            _raise(InvalidArgumentError, "PSTAR_ERR_INVALID_ARGUMENT",
                   f"{call} of {param.name!r}: {mv.nbytes} bytes given, {param.numel} elements of {dtype} are "
                   f"{param.numel * _ELEM_BYTES[dtype]}")

    # -- iterations ------------------------------------------------------
    @contextlib.contextmanager
    def train_iteration(self):
        """A TRAIN iteration; call step() inside it (it ends the iteration)."""
        check(_c.pstar_iteration_begin(self._handle(), _c.PSTAR_ITERATION_TRAIN), "pstar_iteration_begin")
        yield self

    @contextlib.contextmanager
    def eval_iteration(self):
        """An EVAL iteration (forward only), ended on leaving the block."""
        check(_c.pstar_iteration_begin(self._handle(), _c.PSTAR_ITERATION_EVAL), "pstar_iteration_begin")
        try:
            yield self
        finally:
            check(_c.pstar_iteration_end(self._handle()), "pstar_iteration_end")

    def abort_iteration(self):
        """Ends the current TRAIN or EVAL iteration without a step
        (pstar_iteration_abort), e.g. from an exception handler: releases
        what is still acquired, discards the iteration's gradients, and
        leaves the parameters, the optimizer state, the step count, the loss
        scale and the trace as if the iteration had never begun."""
        check(_c.pstar_iteration_abort(self._handle()), "pstar_iteration_abort")

    def acquire(self, param: Param, stage: str = "forward", writable: bool = False, stream=None) -> View:
        """Acquires a parameter for a use (pstar_param_acquire): a View, to
        release (or use in a ``with`` block)."""
        st = _enum(stage, _STAGES, "stage")
        address = check(_c.pstar_param_acquire(self._handle(), param.id, st, stream), "pstar_param_acquire")
        return View(self, param, address, stage, writable, stream)

    def grad_write(self, param: Param, grad, dtype: str = None, stream=None):
        """Adds a gradient from a host buffer to the parameter's accumulator
        (between the backward acquire and its release)."""
        mv = memoryview(grad)
        dtype = self._buffer_dtype(mv, dtype, "grad_write")
        self._check_count(param, mv, dtype, "grad_write")
        check(_c.pstar_grad_write(self._handle(), param.id, grad, param.numel, _DTYPES[dtype], _c.PSTAR_MEM_HOST,
                                  stream), "pstar_grad_write")

    def nonmodel_report(self, nbytes: int):
        check(_c.pstar_nonmodel_report(self._handle(), int(nbytes)), "pstar_nonmodel_report")

    def step(self) -> StepResult:
        """Ends the TRAIN iteration with Adam (pstar_step)."""
        r = _c.pstar_step_result()
        check(_c.pstar_step_result_init(r), "pstar_step_result_init")
        check(_c.pstar_step(self._handle(), r), "pstar_step")
        return StepResult(r.step, bool(r.skipped), r.params_updated, r.grad_norm, r.loss_scale, r.next_loss_scale,
                          r.clip_coef)

    def grad_norm(self) -> float:
        """This TRAIN iteration's global gradient norm, unscaled, once its
        backward is complete: the bits step() will report (pstar_grad_norm);
        infinity when a gradient holds an inf or NaN."""
        return check(_c.pstar_grad_norm(self._handle()), "pstar_grad_norm")

    # -- hyperparameters and statistics ------------------------------------
    def hparam(self, name: str) -> float:
        return check(_c.pstar_hparam_get(self._handle(), _enum(name, _HPARAMS, "hparam")), "pstar_hparam_get")

    def set_hparam(self, name: str, value: float):
        check(_c.pstar_hparam_set(self._handle(), _enum(name, _HPARAMS, "hparam"), float(value)), "pstar_hparam_set")

    @property
    def lr(self) -> float:
        return self.hparam("lr")

    @lr.setter
    def lr(self, value: float):
        self.set_hparam("lr", value)

    @property
    def stats(self) -> dict:
        """pstar_stats as a dict of its fields."""
        s = _c.pstar_stats()
        check(_c.pstar_stats_init(s), "pstar_stats_init")
        check(_c.pstar_engine_get_stats(self._handle(), s), "pstar_engine_get_stats")
        return {k: getattr(s, k) for k in dir(s) if not k.startswith("_") and k not in ("this", "thisown", "size",
                                                                                        "version")}
