// Translation of core exceptions into status codes and the per-thread last
// error, for the shims in this folder.  No exception crosses the C ABI.
#pragma once

#include <new>
#include <string>

#include "pstar/pstar.h"
#include "util/error.h"

namespace pstar::capi {

pstar_status fail(pstar_status status, const std::string& message);

template <class F>
pstar_status guarded(F&& body) noexcept {
  try {
    body();
    return PSTAR_OK;
  } catch (const Error& e) {
    return fail(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return fail(PSTAR_ERR_OUT_OF_MEMORY, "host memory allocation failed");
  } catch (const std::exception& e) {
    return fail(PSTAR_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(PSTAR_ERR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace pstar::capi
