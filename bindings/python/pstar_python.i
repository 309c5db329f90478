/* The Python extension module pstar.capi: the C API (bindings/swig/pstar.i)
 * with Python typemaps.  The Pythonic layer is the pure-Python package
 * `pstar` around it; use that, not this module.
 *
 * Typemaps:
 *   - out-parameters (pstar_engine **, uint32_t *, uint64_t *, double *,
 *     void **, float **) are returned after the status: a call returns
 *     [status, value];
 *   - void ** and float ** come back as integer addresses;
 *   - const void * (sources) and void * (destinations) take an object with
 *     the buffer protocol (writable for destinations) or an integer address
 *     (device memory, which no Python buffer describes);
 *   - (ndim, shape) takes a sequence of integers. */
%module(package="pstar", threads="1") capi

%{
#define SWIG_FILE_WITH_INIT
#include <pstar/pstar.h>
%}

/* threads="1": every wrapped call releases the GIL while it runs in C, so
 * that library threads (the rendezvous store's, a device's workers) can take
 * it to run the log callback while the caller waits in the library. */

/* The log callback: a Python callable(level, message), called under the GIL
 * from whichever thread logs (the library's own ones included). */
%{
static PyObject *pstar_python_log_callable = NULL;

static void pstar_python_log_trampoline(pstar_log_level level, const char *message, void *user) {
  (void)user;
  if (!Py_IsInitialized()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *callable = pstar_python_log_callable;
  if (callable != NULL) {
    Py_INCREF(callable);
    PyObject *r = PyObject_CallFunction(callable, "is", (int)level, message);
    if (r == NULL) {
      PyErr_WriteUnraisable(callable);  /* a raising callback must not break the library */
    } else {
      Py_DECREF(r);
    }
    Py_DECREF(callable);
  }
  PyGILState_Release(gil);
}
%}

/* It touches Python objects: no GIL release around it. */
%nothread pstar_python_set_log_callback;
%inline %{
/* Sets (a callable) or clears (None) the process-wide log callback and the
 * minimum level; returns the status of pstar_log_set_callback. */
int pstar_python_set_log_callback(PyObject *callable, int min_level) {
  int st;
  PyObject *old = pstar_python_log_callable;
  if (callable == Py_None) {
    st = pstar_log_set_callback(NULL, NULL, (pstar_log_level)min_level);
    if (st == PSTAR_OK) {
      pstar_python_log_callable = NULL;
      Py_XDECREF(old);
    }
    return st;
  }
  Py_INCREF(callable);
  pstar_python_log_callable = callable;
  st = pstar_log_set_callback(pstar_python_log_trampoline, NULL, (pstar_log_level)min_level);
  if (st != PSTAR_OK) {
    pstar_python_log_callable = old;
    Py_DECREF(callable);
    return st;
  }
  Py_XDECREF(old);
  return st;
}
%}

%include <typemaps.i>

%apply uint32_t *OUTPUT { uint32_t *out_id, uint32_t *out_count };
%apply uint64_t *OUTPUT { uint64_t *out_numel };
%apply double *OUTPUT { double *out_value, double *out_seconds, double *out_norm };
%apply int *OUTPUT { pstar_dtype *out_dtype };

%typemap(in, numinputs=0) pstar_engine **out_engine (pstar_engine *tmp = NULL) { $1 = &tmp; }
%typemap(argout) pstar_engine **out_engine {
  $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(SWIG_as_voidptr(*$1), $descriptor(pstar_engine *), 0));
}

%typemap(in, numinputs=0) void **out_ptr (void *tmp = NULL), void **out_stream (void *tmp = NULL) { $1 = &tmp; }
%typemap(argout) void **out_ptr, void **out_stream {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromVoidPtr(*$1));
}
%typemap(in, numinputs=0) float **out_ptr (float *tmp = NULL) { $1 = &tmp; }
%typemap(argout) float **out_ptr {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromVoidPtr((void *)*$1));
}

/* Sources: a readable buffer or an integer address. */
%typemap(in) const void *src (Py_buffer view, int have_view = 0),
             const void *grad (Py_buffer view, int have_view = 0) {
  if (PyLong_Check($input)) {
    $1 = PyLong_AsVoidPtr($input);
    if (PyErr_Occurred()) SWIG_fail;
  } else if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
    have_view = 1;
    $1 = view.buf;
  }
}
%typemap(freearg) const void *src, const void *grad {
  if (have_view$argnum) PyBuffer_Release(&view$argnum);
}

/* Destinations: a writable buffer or an integer address. */
%typemap(in) void *dst (Py_buffer view, int have_view = 0) {
  if (PyLong_Check($input)) {
    $1 = PyLong_AsVoidPtr($input);
    if (PyErr_Occurred()) SWIG_fail;
  } else if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) SWIG_fail;
    have_view = 1;
    $1 = view.buf;
  }
}
%typemap(freearg) void *dst {
  if (have_view$argnum) PyBuffer_Release(&view$argnum);
}

/* Streams: an integer address (0 or None for the default stream). */
%typemap(in) void *stream {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    $1 = PyLong_AsVoidPtr($input);
    if (PyErr_Occurred()) SWIG_fail;
  }
}

/* A shape: any sequence of integers. */
%typemap(in) (uint32_t ndim, const int64_t *shape) (int64_t dims[16]) {
  PyObject *seq = PySequence_Fast($input, "shape must be a sequence of integers");
  if (seq == NULL) SWIG_fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > 16) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_ValueError, "shape: at most 16 dimensions");
    SWIG_fail;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    dims[i] = (int64_t)PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (PyErr_Occurred()) {
      Py_DECREF(seq);
      SWIG_fail;
    }
  }
  Py_DECREF(seq);
  $1 = (uint32_t)n;
  $2 = dims;
}

%include "../swig/pstar.i"
