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

__all__ = [
    "Engine", "Options", "Param", "PinnedMaster", "StepResult", "View", "PstarError", "BusyError", "CommError", "DeviceError",
    "InternalError", "InvalidArgumentError", "InvalidHandleError", "InvalidStateError", "NotFoundError",
    "OutOfMemoryError", "PstarIOError", "UnsupportedError", "VersionError", "check", "error_for", "capi",
]
