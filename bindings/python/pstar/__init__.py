"""libpstar for Python: chunk-based memory management for training.

    import numpy as np, pstar
    with pstar.Engine(device="emulated", compute_dtype="bf16") as e:
        w = e.register("w", (4, 4))
        e.build()
        e.write(w, np.ones((4, 4), np.float32))
        with e.train_iteration():
            with e.acquire(w, "forward") as v:
                x = np.from_dlpack(v)          # zero-copy (f16/f32; bf16 via torch)
            with e.acquire(w, "backward"):
                e.grad_write(w, np.full((4, 4), 0.1, np.float32))
            e.step()

Every failing call raises a PstarError subclass (status, status_name,
message).  The C API itself is pstar.capi (SWIG); this package is the
Pythonic surface over it.
"""
from . import capi
from ._engine import Engine, Options, Param, PinnedMaster, StepResult, View
from ._errors import (BusyError, CommError, DeviceError, InternalError, InvalidArgumentError, InvalidHandleError,
                      InvalidStateError, NotFoundError, OutOfMemoryError, PstarError, PstarIOError, UnsupportedError,
                      VersionError, check, error_for)

__version__ = capi.pstar_version_string()

LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF = (capi.PSTAR_LOG_DEBUG, capi.PSTAR_LOG_INFO, capi.PSTAR_LOG_WARN,
                                                      capi.PSTAR_LOG_ERROR, capi.PSTAR_LOG_OFF)


def set_log_callback(callback, min_level=capi.PSTAR_LOG_WARN):
    """Routes the library's log to `callback(level, message)` (None: back to
    stderr) for records at `min_level` and above.  The callback may run on
    the library's own threads; it is called with the GIL held.  An exception
    it raises is reported by sys.unraisablehook and otherwise ignored."""
    if callback is not None and not callable(callback):
        raise TypeError("set_log_callback: callback must be callable or None")
    check(capi.pstar_python_set_log_callback(callback, int(min_level)), "pstar_log_set_callback")

__all__ = [
    "Engine", "Options", "Param", "PinnedMaster", "StepResult", "View", "PstarError", "BusyError", "CommError", "DeviceError",
    "InternalError", "InvalidArgumentError", "InvalidHandleError", "InvalidStateError", "NotFoundError",
    "OutOfMemoryError", "PstarIOError", "UnsupportedError", "VersionError", "check", "error_for", "capi",
    "set_log_callback", "LOG_DEBUG", "LOG_INFO", "LOG_WARN", "LOG_ERROR", "LOG_OFF",
]
