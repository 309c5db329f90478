/* The C API of libpstar for SWIG, shared by every language: the header is
 * wrapped once, as it is.  A language's own .i file sets its module name and
 * typemaps (out-parameters, buffers, shapes), then includes this file.
 *
 * What crosses: every pstar_* function that returns a pstar_status returns
 * it as an integer, and every enum value is an integer constant with its C
 * name (PSTAR_ERR_BUSY, PSTAR_DTYPE_BF16...), so that a status code added by
 * a later library never breaks an older binding.  The options, statistics
 * and step-result structs are wrapped as plain structs with their fields.
 *
 * Not wrapped here: pstar_log_set_callback (the callback runs on the
 * engine's threads; a language adds it with its own thread handling) and
 * pstar_free (nothing the wrapped calls return needs it). */

%{
#include <pstar/pstar.h>
%}

%include <stdint.i>

/* The visibility macro means nothing to SWIG. */
#define PSTAR_API

%ignore pstar_log_set_callback;
%ignore pstar_free;
/* The *_FORCE_32BIT_ members pin enum sizes; they are no values. */
%rename("$ignore", regexmatch$name="_FORCE_32BIT_$") "";

%include "pstar/pstar.h"
