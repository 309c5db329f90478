#include <criterion/criterion.h>

#include "memory/emulated_device.h"
#include "memory/host_pool.h"
#include "util/error.h"

using namespace pstar::memory;

Test(host_pool, reuses_buffers_of_the_same_size) {
  EmulatedDevice dev(false, 0);
  HostPool pool(&dev, 0);
  void* a = pool.acquire(4096);
  pool.release(a, 4096);
  void* b = pool.acquire(4096);
  cr_assert_eq(a, b);
  cr_assert_eq(pool.held_bytes(), 4096u);
  cr_assert_eq(pool.in_use_bytes(), 4096u);
  pool.release(b, 4096);
  cr_assert_eq(pool.in_use_bytes(), 0u);
}

Test(host_pool, enforces_capacity_and_drops_cache_of_other_sizes) {
  EmulatedDevice dev(false, 0);
  HostPool pool(&dev, 10000);
  void* a = pool.acquire(6000);
  cr_assert(!pool.can_acquire(6000));
  bool oom = false;
  try {
    pool.acquire(6000);
  } catch (const pstar::Error& e) {
    oom = e.status() == PSTAR_ERR_OUT_OF_MEMORY && std::string(e.what()).find("host tier") != std::string::npos;
  }
  cr_assert(oom);
  pool.release(a, 6000);
  // The cached 6000-byte buffer is dropped to make room for 8000.
  cr_assert(pool.can_acquire(8000));
  void* b = pool.acquire(8000);
  cr_assert_eq(pool.held_bytes(), 8000u);
  cr_assert_eq(pool.peak_bytes(), 8000u);
  pool.release(b, 8000);
}
