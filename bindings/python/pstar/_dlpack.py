"""DLPack export of engine memory, in pure Python (ctypes).

A capsule holds a DLManagedTensor (the legacy struct, capsule name
"dltensor") or, when the consumer passes ``max_version`` with a major version
of 1 or more, a DLManagedTensorVersioned ("dltensor_versioned", with the
read-only flag where the memory is read-only).  Both follow the DLPack
specification (dlpack.h v1.0): the consumer renames a capsule it takes and
later calls the struct's deleter; a capsule never taken is cleaned up by its
own destructor, which then calls the deleter itself.

The deleter tells the exporter (through ``on_free``) that the consumer is
done, so that the engine can refuse to release memory still in use.
"""
import ctypes

# dlpack.h
KDL_CPU = 1
KDL_CUDA = 2
KDL_INT = 0
KDL_UINT = 1
KDL_FLOAT = 2
KDL_BFLOAT = 4
FLAG_READ_ONLY = 1 << 0
DLPACK_MAJOR = 1
DLPACK_MINOR = 0


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"

# Exports alive: the managed struct's address -> (struct, shape array,
# on_free).  The deleter removes the entry, which frees the memory ctypes
# owns; until then the struct must stay where the consumer points.
_live = {}


def _free(address: int) -> None:
    entry = _live.pop(address, None)
    if entry is not None and entry[2] is not None:
        entry[2]()


@_Deleter
def _deleter(address):
    _free(address)


# PyCapsule destructor: void (*)(PyObject *).  A capsule the consumer took
# has been renamed ("used_dltensor..."): nothing to do then.
@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    for name in (_LEGACY, _VERSIONED):
        if _PyCapsule_IsValid(capsule, name):
            _free(_PyCapsule_GetPointer(capsule, name))
            return


_DESTRUCTOR = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value


def dtype_of(name: str) -> DLDataType:
    codes = {"bf16": (KDL_BFLOAT, 16), "f16": (KDL_FLOAT, 16), "f32": (KDL_FLOAT, 32)}
    code, bits = codes[name]
    return DLDataType(code, bits, 1)


def make_capsule(data: int, shape, dtype: str, device, read_only: bool, versioned: bool, on_free=None):
    """A DLPack capsule for `data` (C-contiguous `shape` of `dtype`)."""
    shape_arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    tensor = DLTensor()
    tensor.data = data
    tensor.device = DLDevice(*device)
    tensor.ndim = len(shape)
    tensor.dtype = dtype_of(dtype)
    tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = None  # compact, row-major
    tensor.byte_offset = 0
    if versioned:
        managed = DLManagedTensorVersioned()
        managed.version = DLPackVersion(DLPACK_MAJOR, DLPACK_MINOR)
        managed.flags = FLAG_READ_ONLY if read_only else 0
        name = _VERSIONED
    else:
        managed = DLManagedTensor()
        name = _LEGACY
    managed.dl_tensor = tensor
    managed.manager_ctx = None
    managed.deleter = _deleter
    address = ctypes.addressof(managed)
    _live[address] = (managed, shape_arr, on_free)
    return _PyCapsule_New(address, name, _DESTRUCTOR)


def live_exports() -> int:
    """Exports whose consumer has not freed them yet (for tests)."""
    return len(_live)
