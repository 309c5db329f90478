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
#include <pthread.h>
#include <stdint.h>
#include <pstar/pstar.h>

/* The log handler: an object with void log(int level, String message),
 * called on whichever thread logs.  A thread the JVM does not know (the
 * library's own) is attached for the call, as a daemon, and detached after.
 * The mutex keeps the handler alive during a call; a handler must not set
 * another handler from inside log(). */
static JavaVM *pstar_java_vm = NULL;
static jobject pstar_java_log_handler = NULL;  /* a global reference */
static jmethodID pstar_java_log_method = NULL;
static pthread_mutex_t pstar_java_log_mutex = PTHREAD_MUTEX_INITIALIZER;

static void pstar_java_log_trampoline(pstar_log_level level, const char *message, void *user) {
  JNIEnv *env = NULL;
  int attached = 0;
  (void)user;
  pthread_mutex_lock(&pstar_java_log_mutex);
  if (pstar_java_vm != NULL && pstar_java_log_handler != NULL) {
    jint rc = (*pstar_java_vm)->GetEnv(pstar_java_vm, (void **)&env, JNI_VERSION_1_8);
    if (rc == JNI_EDETACHED) {
      if ((*pstar_java_vm)->AttachCurrentThreadAsDaemon(pstar_java_vm, (void **)&env, NULL) == JNI_OK) attached = 1;
      else env = NULL;
    } else if (rc != JNI_OK) {
      env = NULL;
    }
    if (env != NULL) {
      jstring text = (*env)->NewStringUTF(env, message);
      (*env)->CallVoidMethod(env, pstar_java_log_handler, pstar_java_log_method, (jint)level, text);
      if ((*env)->ExceptionCheck(env)) {
        (*env)->ExceptionDescribe(env);  /* a throwing handler must not break the library */
        (*env)->ExceptionClear(env);
      }
      if (text != NULL) (*env)->DeleteLocalRef(env, text);
      if (attached) (*pstar_java_vm)->DetachCurrentThread(pstar_java_vm);
    }
  }
  pthread_mutex_unlock(&pstar_java_log_mutex);
}
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
%apply double *OUTPUT { double *out_value, double *out_seconds, double *out_norm };
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

/* The handler object as java.lang.Object (org.libpstar.LogHandler above). */
%typemap(jni) jobject handler "jobject"
%typemap(jtype) jobject handler "Object"
%typemap(jstype) jobject handler "Object"
%typemap(javain) jobject handler "$javainput"
%typemap(in) jobject handler %{ $1 = $input; %}
%inline %{
/* Sets (an object with log(int, String)) or clears (null) the process-wide
 * log handler and the minimum level; returns pstar_log_set_callback's
 * status. */
int pstar_java_set_log_handler(JNIEnv *jenv, jobject handler, int min_level) {
  int st;
  jobject old;
  pthread_mutex_lock(&pstar_java_log_mutex);
  old = pstar_java_log_handler;
  if (handler == NULL) {
    st = pstar_log_set_callback(NULL, NULL, (pstar_log_level)min_level);
    if (st == PSTAR_OK) pstar_java_log_handler = NULL;
  } else {
    jclass cls = (*jenv)->GetObjectClass(jenv, handler);
    jmethodID m = (*jenv)->GetMethodID(jenv, cls, "log", "(ILjava/lang/String;)V");
    if (m == NULL) {
      (*jenv)->ExceptionClear(jenv);
      pthread_mutex_unlock(&pstar_java_log_mutex);
      return PSTAR_ERR_INVALID_ARGUMENT;
    }
    if (pstar_java_vm == NULL) (*jenv)->GetJavaVM(jenv, &pstar_java_vm);
    pstar_java_log_method = m;
    pstar_java_log_handler = (*jenv)->NewGlobalRef(jenv, handler);
    st = pstar_log_set_callback(pstar_java_log_trampoline, NULL, (pstar_log_level)min_level);
    if (st != PSTAR_OK) {
      (*jenv)->DeleteGlobalRef(jenv, pstar_java_log_handler);
      pstar_java_log_handler = old;
      old = NULL;
    }
  }
  if (st == PSTAR_OK && old != NULL) (*jenv)->DeleteGlobalRef(jenv, old);
  pthread_mutex_unlock(&pstar_java_log_mutex);
  return st;
}
%}

%include "../swig/pstar.i"
