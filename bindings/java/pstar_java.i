/* The Java module: the C API (bindings/swig/pstar.i) with JNI typemaps, in
 * package org.libpstar.capi (class PstarC, JNI class PstarJNI).  The
 * idiomatic layer is org.libpstar (Engine, Options, View, the exception
 * hierarchy); use that, not this.
 *
 * Typemaps:
 *   - 64-bit unsigned values (uint64_t) are Java long, never BigInteger;
 *   - the engine handle and other addresses (streams, acquired memory) are
 *     long; out-parameters are arrays of length 1 (long[], double[]);
 *   - buffers (const void *src, const void *grad, void *dst) are direct
 *     java.nio.ByteBuffers; a shape is a long[];
 *   - pstar_java_wrap(address, bytes) makes a direct ByteBuffer over memory
 *     the library handed out (acquired parameters). */
%module(jniclassname="PstarJNI") PstarC

%{
#include <stdint.h>
%}

%include <typemaps.i>
%include <enumsimple.swg>
%javaconst(1);
/* Constants whose C initialisers are not Java expressions (1u << 0): read
 * through JNI instead of copied. */
%javaconst(0) PSTAR_PARAM_FROZEN;
%javaconst(0) PSTAR_PARAM_NO_WEIGHT_DECAY;
%javaconst(0) PSTAR_DEFAULT_CHUNK_ELEMS;

%apply long long { uint64_t };
%apply long long *OUTPUT { uint64_t *out_numel };
%apply unsigned int *OUTPUT { uint32_t *out_id, uint32_t *out_count };
%apply double *OUTPUT { double *out_value, double *out_seconds };
%apply int *OUTPUT { pstar_dtype *out_dtype };

/* The engine handle as a long. */
%typemap(jni) pstar_engine * "jlong"
%typemap(jtype) pstar_engine * "long"
%typemap(jstype) pstar_engine * "long"
%typemap(javain) pstar_engine * "$javainput"
%typemap(in) pstar_engine * %{ $1 = (pstar_engine *)(intptr_t)$input; %}

/* Out-addresses as long[1]. */
%define PSTAR_OUT_ADDRESS(TYPE, NAME)
%typemap(jni) TYPE NAME "jlongArray"
%typemap(jtype) TYPE NAME "long[]"
%typemap(jstype) TYPE NAME "long[]"
%typemap(javain) TYPE NAME "$javainput"
%typemap(in) TYPE NAME ($*1_ltype tmp = 0) %{
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "an out-parameter array of length 1 is needed");
    return $null;
  }
  $1 = &tmp;
%}
%typemap(argout) TYPE NAME %{
  {
    jlong v = (jlong)(intptr_t)tmp$argnum;
    (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &v);
  }
%}
%enddef
PSTAR_OUT_ADDRESS(pstar_engine **, out_engine)
PSTAR_OUT_ADDRESS(void **, out_ptr)
PSTAR_OUT_ADDRESS(void **, out_stream)
PSTAR_OUT_ADDRESS(float **, out_ptr)

/* Streams as long (0: the default stream). */
%typemap(jni) void *stream "jlong"
%typemap(jtype) void *stream "long"
%typemap(jstype) void *stream "long"
%typemap(javain) void *stream "$javainput"
%typemap(in) void *stream %{ $1 = (void *)(intptr_t)$input; %}

/* Buffers: direct ByteBuffers. */
%typemap(jni) const void *src, const void *grad, void *dst "jobject"
%typemap(jtype) const void *src, const void *grad, void *dst "java.nio.ByteBuffer"
%typemap(jstype) const void *src, const void *grad, void *dst "java.nio.ByteBuffer"
%typemap(javain) const void *src, const void *grad, void *dst "$javainput"
%typemap(in) const void *src, const void *grad, void *dst %{
  $1 = NULL;
  if ($input) {
    $1 = (*jenv)->GetDirectBufferAddress(jenv, $input);
    if (!$1) {
      SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "a direct ByteBuffer is needed");
      return $null;
    }
  }
%}

/* A shape: long[]. */
%typemap(jni) (uint32_t ndim, const int64_t *shape) "jlongArray"
%typemap(jtype) (uint32_t ndim, const int64_t *shape) "long[]"
%typemap(jstype) (uint32_t ndim, const int64_t *shape) "long[]"
%typemap(javain) (uint32_t ndim, const int64_t *shape) "$javainput"
%typemap(in) (uint32_t ndim, const int64_t *shape) (jlong *elems = NULL) %{
  if (!$input) {
    SWIG_JavaThrowException(jenv, SWIG_JavaNullPointerException, "shape is null");
    return $null;
  }
  $1 = (uint32_t)(*jenv)->GetArrayLength(jenv, $input);
  elems = (*jenv)->GetLongArrayElements(jenv, $input, 0);
  $2 = ($2_ltype)elems;
%}
%typemap(freearg) (uint32_t ndim, const int64_t *shape) %{
  if (elems$argnum) (*jenv)->ReleaseLongArrayElements(jenv, $input, elems$argnum, JNI_ABORT);
%}

/* A direct ByteBuffer over library memory. */
%typemap(jni) jobject "jobject"
%typemap(jtype) jobject "java.nio.ByteBuffer"
%typemap(jstype) jobject "java.nio.ByteBuffer"
%typemap(out) jobject %{ $result = $1; %}
%typemap(javaout) jobject { return $jnicall; }
%typemap(in, numinputs=0) JNIEnv *jenv %{ $1 = jenv; %}
%inline %{
jobject pstar_java_wrap(JNIEnv *jenv, long long address, long long bytes) {
  return (*jenv)->NewDirectByteBuffer(jenv, (void *)(intptr_t)address, (jlong)bytes);
}
%}

%include "../swig/pstar.i"
