// The C API's options validation (capi/options.cpp): used by
// pstar_engine_create, and by internal tests that build an engine on a group
// of their own.
#pragma once

#include "engine/options.h"
#include "pstar/pstar.h"

namespace pstar::capi {

// Checks `in` (size, version, ranges, combinations) and returns it with
// every default filled in; throws pstar::Error.
engine::EngineOptions engine_options(const pstar_engine_options& in);

}  // namespace pstar::capi
