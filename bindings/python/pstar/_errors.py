"""Typed exceptions for libpstar's status codes.

Every call of the C API returns a status; a non-OK one becomes an exception
of the class registered for it, carrying the status code, its name and the
library's per-thread last error message.  A status this binding does not know
(added by a later library) becomes a plain PstarError: it never breaks.
"""
from . import capi as _c


class PstarError(Exception):
    """A libpstar call failed.

    Attributes: ``status`` (the integer code), ``status_name`` (its C name,
    e.g. ``"PSTAR_ERR_BUSY"``), ``message`` (the library's message), ``call``
    (the C function).
    """

    def __init__(self, status: int, status_name: str, message: str, call: str = ""):
        self.status = status
        self.status_name = status_name
        self.message = message
        self.call = call
        where = f"{call}: " if call else ""
        super().__init__(f"{where}{status_name}: {message}")


class InvalidArgumentError(PstarError, ValueError):
    """PSTAR_ERR_INVALID_ARGUMENT."""


class InvalidHandleError(PstarError):
    """PSTAR_ERR_INVALID_HANDLE: the engine was destroyed or never created."""


class InvalidStateError(PstarError):
    """PSTAR_ERR_INVALID_STATE: the call is not legal now."""


class NotFoundError(PstarError, LookupError):
    """PSTAR_ERR_NOT_FOUND."""


class OutOfMemoryError(PstarError, MemoryError):
    """PSTAR_ERR_OUT_OF_MEMORY: a tier's capacity is exhausted (the engine stays usable)."""


class BusyError(PstarError):
    """PSTAR_ERR_BUSY: memory is still exported (a DLPack tensor not yet freed)."""


class UnsupportedError(PstarError):
    """PSTAR_ERR_UNSUPPORTED: not in this build or on this machine."""


class DeviceError(PstarError):
    """PSTAR_ERR_DEVICE: an accelerator runtime call failed."""


class PstarIOError(PstarError, OSError):
    """PSTAR_ERR_IO."""


class CommError(PstarError):
    """PSTAR_ERR_COMM: a collective or the rendezvous failed."""


class VersionError(PstarError):
    """PSTAR_ERR_VERSION: a struct of another version than the library knows."""


class InternalError(PstarError):
    """PSTAR_ERR_INTERNAL: a bug in libpstar."""


_BY_STATUS = {
    _c.PSTAR_ERR_INVALID_ARGUMENT: InvalidArgumentError,
    _c.PSTAR_ERR_INVALID_HANDLE: InvalidHandleError,
    _c.PSTAR_ERR_INVALID_STATE: InvalidStateError,
    _c.PSTAR_ERR_NOT_FOUND: NotFoundError,
    _c.PSTAR_ERR_OUT_OF_MEMORY: OutOfMemoryError,
    _c.PSTAR_ERR_BUSY: BusyError,
    _c.PSTAR_ERR_UNSUPPORTED: UnsupportedError,
    _c.PSTAR_ERR_DEVICE: DeviceError,
    _c.PSTAR_ERR_IO: PstarIOError,
    _c.PSTAR_ERR_COMM: CommError,
    _c.PSTAR_ERR_VERSION: VersionError,
    _c.PSTAR_ERR_INTERNAL: InternalError,
}


def error_for(status: int, call: str = "", message: str = None) -> PstarError:
    """The exception for a non-OK status (the last error message unless given)."""
    cls = _BY_STATUS.get(status, PstarError)
    if message is None:
        message = _c.pstar_last_error_message() or _c.pstar_status_string(status)
    return cls(status, _c.pstar_status_name(status), message, call)


def check(result, call: str):
    """Raises for a non-OK status; returns the out-values of a call.

    A SWIG call returns either the status alone or [status, value, ...].
    """
    if isinstance(result, list):
        status, values = result[0], result[1:]
    else:
        status, values = result, []
    if status != _c.PSTAR_OK:
        raise error_for(status, call)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)
