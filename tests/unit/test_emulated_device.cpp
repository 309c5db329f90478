#include <criterion/criterion.h>

#include <cstring>
#include <vector>

#include "memory/emulated_device.h"

using namespace pstar::memory;

Test(emulated_device, copies_complete_in_stream_order_and_events_report_it) {
  EmulatedDevice dev(false, 1);
  std::vector<float> src(1 << 16, 3.0f);
  void* d = dev.allocate(src.size() * 4);
  std::vector<float> back(src.size(), 0.0f);
  dev.copy_async(dev.h2d_stream(), d, src.data(), src.size() * 4, CopyKind::kHostToDevice);
  EventPtr up = dev.record(dev.h2d_stream());
  dev.stream_wait(dev.d2h_stream(), up);
  dev.copy_async(dev.d2h_stream(), back.data(), d, src.size() * 4, CopyKind::kDeviceToHost);
  EventPtr down = dev.record(dev.d2h_stream());
  dev.synchronize(down);
  cr_assert(dev.query(up));
  cr_assert(dev.query(down));
  cr_assert_eq(std::memcmp(back.data(), src.data(), src.size() * 4), 0);
  dev.deallocate(d, src.size() * 4);
}

Test(emulated_device, strict_mode_poisons_destinations_until_the_copy_runs) {
  EmulatedDevice dev(true, 42);
  const size_t n = 1024;
  std::vector<uint8_t> src(n, 7);
  std::vector<uint8_t> dst(n, 0);
  // Hold the stream back with an event that is not complete yet.
  std::vector<uint8_t> gate_src(16, 1), gate_dst(16, 0);
  EventPtr blocker = dev.record(dev.compute_stream());
  dev.synchronize(blocker);
  // Queue the copy behind a long chain so we can observe the poison.
  for (int i = 0; i < 50; ++i) dev.copy_async(dev.h2d_stream(), gate_dst.data(), gate_src.data(), 16, CopyKind::kHostToDevice);
  dev.copy_async(dev.h2d_stream(), dst.data(), src.data(), n, CopyKind::kHostToDevice);
  EventPtr done = dev.record(dev.h2d_stream());
  if (!dev.query(done)) {
    // Not yet copied: the destination must hold poison, not stale zeros.
    cr_assert_eq(dst[n - 1], static_cast<uint8_t>(kPoisonByte));
  }
  dev.synchronize(done);
  cr_assert_eq(dst[0], 7);
  cr_assert_eq(dst[n - 1], 7);
}

Test(emulated_device, null_event_is_complete_and_stream_wait_orders_streams) {
  EmulatedDevice dev(true, 3);
  cr_assert(dev.query(EventPtr()));
  dev.synchronize(EventPtr());
  std::vector<int> a(256, 5), b(256, 0), c(256, 0);
  dev.copy_async(dev.h2d_stream(), b.data(), a.data(), a.size() * 4, CopyKind::kHostToDevice);
  EventPtr e = dev.record(dev.h2d_stream());
  dev.stream_wait(dev.d2h_stream(), e);
  dev.copy_async(dev.d2h_stream(), c.data(), b.data(), b.size() * 4, CopyKind::kDeviceToHost);
  dev.synchronize(dev.d2h_stream());
  // Without the wait, c could have been copied from the poisoned b.
  for (int v : c) cr_assert_eq(v, 5);
}

Test(emulated_device, caller_stream_accepts_null_and_its_own_handle_only) {
  EmulatedDevice dev(false, 0);
  cr_assert_eq(dev.caller_stream(nullptr), dev.compute_stream());
  cr_assert_eq(dev.caller_stream(dev.compute_stream_handle()), dev.compute_stream());
  bool threw = false;
  int other = 0;
  try {
    dev.caller_stream(&other);
  } catch (const std::exception&) {
    threw = true;
  }
  cr_assert(threw);
}

Test(emulated_device, gradient_operations) {
  EmulatedDevice dev(true, 9);
  const size_t n = 10000;
  float* acc = static_cast<float*>(dev.allocate(n * 4));
  dev.memset_async(dev.compute_stream(), acc, 0, n * 4);
  std::vector<float> g(n, 0.5f);
  dev.grad_accumulate(dev.compute_stream(), acc, g.data(), PSTAR_DTYPE_F32, PSTAR_MEM_HOST, n);
  dev.grad_accumulate(dev.compute_stream(), acc, g.data(), PSTAR_DTYPE_F32, PSTAR_MEM_HOST, n);
  std::vector<uint16_t> slot(n);
  double sumsq = -1;
  int bad = -1;
  dev.grad_finalize(dev.compute_stream(), acc, slot.data(), PSTAR_DTYPE_BF16, n, &sumsq, &bad);
  dev.synchronize(dev.compute_stream());
  cr_assert_eq(slot[0], 0x3f80);  // 1.0 in bf16
  cr_assert_eq(sumsq, static_cast<double>(n));
  cr_assert_eq(bad, 0);
  g[17] = INFINITY;
  dev.grad_accumulate(dev.compute_stream(), acc, g.data(), PSTAR_DTYPE_F32, PSTAR_MEM_HOST, n);
  dev.grad_finalize(dev.compute_stream(), acc, slot.data(), PSTAR_DTYPE_BF16, n, &sumsq, &bad);
  dev.synchronize(dev.compute_stream());
  cr_assert_eq(bad, 1);
  dev.deallocate(acc, n * 4);
}
