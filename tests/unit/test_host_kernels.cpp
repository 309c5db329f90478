// The host gradient operations (src/memory/host_kernels.h): the norm's
// order of operations against a reference written here as the CUDA kernel
// runs (one thread per lane striding the block, then the shared-memory
// tree), and the AVX2 path against the scalar one, bit for bit, over sizes
// that cut blocks, rows and lane groups, the three dtypes, and values that
// round, overflow, underflow or are not finite.
#include <criterion/criterion.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "memory/device.h"
#include "memory/host_kernels.h"
#include "util/dtype.h"

using pstar::memory::HostKernelIsa;
using pstar::memory::kNormBlockElems;
using pstar::memory::kNormLanes;

namespace {

const size_t kSizes[] = {0, 1, 7, 15, 16, 17, 255, 256, 257, 300, 4095, 4096, 4097, 10000, 3 * 4096 + 300};
const pstar_dtype kDtypes[] = {PSTAR_DTYPE_F32, PSTAR_DTYPE_F16, PSTAR_DTYPE_BF16};

uint64_t bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

// The norm as the CUDA finalize kernel computes it, written out plainly:
// per block, thread t sums values t, t + lanes, ...; a halving tree adds
// the threads' sums; the host adds the blocks' partials in order.
double reference_sumsq(const std::vector<float>& rounded) {
  double total = 0.0;
  for (size_t begin = 0; begin < rounded.size(); begin += kNormBlockElems) {
    const size_t end = std::min(begin + kNormBlockElems, rounded.size());
    std::vector<double> sums(kNormLanes, 0.0);
    for (size_t t = 0; t < kNormLanes; ++t) {
      double s = 0.0;
      for (size_t i = begin + t; i < end; i += kNormLanes) {
        const double g = rounded[i];
        s += g * g;
      }
      sums[t] = s;
    }
    for (size_t w = kNormLanes / 2; w > 0; w /= 2) {
      for (size_t t = 0; t < w; ++t) sums[t] += sums[t + w];
    }
    total += sums[0];
  }
  return total;
}

// Values of every magnitude (fp16 subnormals and overflow among them), in
// both signs.
std::vector<float> gradients(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(0.5f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 15);  // below fp16 overflow
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = std::ldexp(mant(rng), expo(rng));
    g[i] = (rng() & 1) ? -v : v;
  }
  return g;
}

std::vector<HostKernelIsa> paths() {
  std::vector<HostKernelIsa> out{HostKernelIsa::kScalar};
  if (pstar::memory::host_kernel_isa_supported(HostKernelIsa::kAvx2)) {
    out.push_back(HostKernelIsa::kAvx2);
  } else {
    cr_log_warn("skipped: the AVX2 path (no AVX2, FMA and F16C on this CPU); only the scalar path checked");
  }
  return out;
}

}  // namespace

Test(host_kernels, finalize_matches_the_cuda_order_and_dtype_rounding) {
  for (HostKernelIsa isa : paths()) {
    for (pstar_dtype dt : kDtypes) {
      for (size_t n : kSizes) {
        const std::vector<float> acc = gradients(n, n * 7 + dt);
        std::vector<uint8_t> slot(n * pstar::dtype_size(dt) + 1, 0xee);
        double sumsq = -1.0;
        int bad = -1;
        pstar::memory::host_grad_finalize(isa, acc.data(), slot.data(), dt, n, &sumsq, &bad);
        std::vector<float> rounded(n);
        for (size_t i = 0; i < n; ++i) {
          std::vector<uint8_t> one(4);
          pstar::store_as(one.data(), dt, 0, acc[i]);
          cr_assert_eq(std::memcmp(slot.data() + i * pstar::dtype_size(dt), one.data(), pstar::dtype_size(dt)), 0,
                       "dtype %d n %zu: element %zu stored differently from store_as", dt, n, i);
          rounded[i] = pstar::load_as(one.data(), dt, 0);
        }
        cr_assert_eq(slot.back(), 0xee, "wrote past the slot");
        const bool any_inf = std::any_of(rounded.begin(), rounded.end(), [](float v) { return !std::isfinite(v); });
        cr_assert_eq(bad, any_inf ? 1 : 0, "dtype %d n %zu: flag", dt, n);
        if (!any_inf) {
          cr_assert_eq(bits(sumsq), bits(reference_sumsq(rounded)), "isa %d dtype %d n %zu: %.17g", static_cast<int>(isa),
                       dt, n, sumsq);
        }
      }
    }
  }
}

Test(host_kernels, norm_matches_the_cuda_order) {
  for (HostKernelIsa isa : paths()) {
    for (size_t n : kSizes) {
      std::vector<float> g = gradients(n, n + 3);
      for (float& v : g) v = std::ldexp(v, -10);  // fp32 gradients: no overflow
      double sumsq = -1.0;
      int bad = -1;
      pstar::memory::host_grad_norm(isa, g.data(), n, &sumsq, &bad);
      cr_assert_eq(bits(sumsq), bits(reference_sumsq(g)), "n %zu", n);
      cr_assert_eq(bad, 0);
    }
  }
}

Test(host_kernels, paths_agree_on_non_finite_and_special_values) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f, -0.0f, 1e-40f, -1e-45f, 65504.0f, 65520.0f, 3.0e38f, inf, -inf, nan};
  const std::vector<HostKernelIsa> isas = paths();
  for (pstar_dtype dt : kDtypes) {
    for (size_t where : {size_t{0}, size_t{300}, size_t{4095}, size_t{4100}}) {
      for (float sv : specials) {
        const size_t n = 4096 + 300;
        std::vector<float> acc = gradients(n, where);
        acc[where] = sv;
        std::vector<std::vector<uint8_t>> slots;
        std::vector<double> sums;
        std::vector<int> flags;
        for (HostKernelIsa isa : isas) {
          slots.emplace_back(n * pstar::dtype_size(dt));
          sums.push_back(0.0);
          flags.push_back(-1);
          pstar::memory::host_grad_finalize(isa, acc.data(), slots.back().data(), dt, n, &sums.back(), &flags.back());
        }
        float rounded;
        {
          std::vector<uint8_t> one(4);
          pstar::store_as(one.data(), dt, 0, sv);
          rounded = pstar::load_as(one.data(), dt, 0);
        }
        cr_assert_eq(flags[0], std::isfinite(rounded) ? 0 : 1, "dtype %d value %g at %zu", dt, sv, where);
        for (size_t k = 1; k < isas.size(); ++k) {
          cr_assert(slots[k] == slots[0], "dtype %d value %g at %zu: slots differ", dt, sv, where);
          cr_assert_eq(flags[k], flags[0]);
          cr_assert(bits(sums[k]) == bits(sums[0]) || (std::isnan(sums[k]) && std::isnan(sums[0])),
                    "dtype %d value %g at %zu: sums differ", dt, sv, where);
        }
      }
    }
  }
}

// Onto zero: the bits of zeroing and then adding, whatever acc held (NaN
// here, as a strict device's fresh buffer), -0 sources becoming +0.
Test(host_kernels, accumulate_onto_zero_is_zeroing_then_adding) {
  for (pstar_dtype dt : kDtypes) {
    for (size_t n : kSizes) {
      std::vector<float> src32 = gradients(n, n * 7 + dt);
      for (size_t i = 0; i < n; i += 5) src32[i] = -0.0f;
      std::vector<uint8_t> src(n * pstar::dtype_size(dt));
      for (size_t i = 0; i < n; ++i) pstar::store_as(src.data(), dt, i, src32[i]);
      for (HostKernelIsa isa : paths()) {
        std::vector<float> want(n, 0.0f);
        pstar::memory::host_grad_accumulate(isa, want.data(), src.data(), dt, n);
        std::vector<float> acc(n, std::numeric_limits<float>::quiet_NaN());
        pstar::memory::host_grad_accumulate(isa, acc.data(), src.data(), dt, n, true);
        cr_assert(n == 0 || std::memcmp(acc.data(), want.data(), n * sizeof(float)) == 0, "dtype %d n %zu", dt, n);
        for (size_t i = 0; i < n; i += 5) cr_assert(!std::signbit(acc[i]), "dtype %d n %zu [%zu] is -0", dt, n, i);
      }
    }
  }
}

Test(host_kernels, accumulate_paths_agree) {
  for (pstar_dtype dt : kDtypes) {
    for (size_t n : kSizes) {
      const std::vector<float> src32 = gradients(n, n * 5 + dt);
      std::vector<uint8_t> src(n * pstar::dtype_size(dt));
      for (size_t i = 0; i < n; ++i) pstar::store_as(src.data(), dt, i, src32[i]);
      std::vector<float> want = gradients(n, n + 11);
      std::vector<float> start = want;
      for (size_t i = 0; i < n; ++i) want[i] += pstar::load_as(src.data(), dt, i);
      for (HostKernelIsa isa : paths()) {
        std::vector<float> acc = start;
        pstar::memory::host_grad_accumulate(isa, acc.data(), src.data(), dt, n);
        cr_assert(n == 0 || std::memcmp(acc.data(), want.data(), n * sizeof(float)) == 0, "dtype %d n %zu", dt, n);
      }
    }
  }
}

// A packed gradient (host_grad_pack) is the finalize of its one
// contribution accumulated onto zero: the same packed values as the slot,
// the same squared sum and flag, on every path, over every size, with -0
// (which becomes +0), subnormals, overflow, infinities and NaN among the
// values.  Unpacking in place gives the fp32 sum accumulating onto zero
// gives.
Test(host_kernels, pack_is_accumulate_onto_zero_then_finalize) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {-0.0f, 1e-40f, -1e-45f, 65520.0f, 3.0e38f, inf, -inf, nan};
  for (pstar_dtype dt : kDtypes) {
    const size_t esize = pstar::dtype_size(dt);
    for (size_t n : kSizes) {
      for (int variant = 0; variant < 2; ++variant) {
        std::vector<float> src32 = gradients(n, n * 3 + dt);
        for (size_t i = 0; i < n; i += 5) src32[i] = -0.0f;
        if (variant == 1 && n > 0) src32[n / 2] = specials[(n + dt) % (sizeof specials / sizeof specials[0])];
        std::vector<uint8_t> src(n * esize);
        for (size_t i = 0; i < n; ++i) pstar::store_as(src.data(), dt, i, src32[i]);
        for (HostKernelIsa isa : paths()) {
          std::vector<float> acc(n);
          pstar::memory::host_grad_accumulate(isa, acc.data(), src.data(), dt, n, true);
          std::vector<uint8_t> slot(n * esize);
          double want_sum = -1.0;
          int want_flag = -1;
          pstar::memory::host_grad_finalize(isa, acc.data(), slot.data(), dt, n, &want_sum, &want_flag);
          // Packed into the first bytes of an fp32 buffer, as the engine
          // packs into its accumulator (poisoned first).
          std::vector<float> buf(n, nan);
          double sum = -1.0;
          int flag = -1;
          pstar::memory::host_grad_pack(isa, buf.data(), src.data(), dt, n, &sum, &flag);
          cr_assert(n == 0 || std::memcmp(buf.data(), slot.data(), n * esize) == 0, "dtype %d n %zu: packed values",
                    dt, n);
          cr_assert(bits(sum) == bits(want_sum) || (std::isnan(sum) && std::isnan(want_sum)),
                    "dtype %d n %zu: squared sum %.17g, finalize's %.17g", dt, n, sum, want_sum);
          cr_assert_eq(flag, want_flag, "dtype %d n %zu", dt, n);
          pstar::memory::host_grad_unpack(buf.data(), dt, n);
          for (size_t i = 0; i < n; ++i) {
            const bool same = std::memcmp(&buf[i], &acc[i], sizeof(float)) == 0 ||
                              (dt != PSTAR_DTYPE_F32 && std::isnan(buf[i]) && std::isnan(acc[i]));
            cr_assert(same, "dtype %d n %zu: unpacked [%zu] %g, accumulated %g", dt, n, i, buf[i], acc[i]);
          }
        }
      }
    }
  }
}

// Large slots on the vector path: 32-byte aligned ones are written with
// non-temporal stores (host_kernels_avx2.cpp, kNtSlotBytes), others with
// cached stores; both give the scalar path's bits, for the finalize and the
// pack, with a partial last row.
Test(host_kernels, large_aligned_and_unaligned_slots_same_bits) {
  const size_t n = 3 * 65536 + 300;
  for (pstar_dtype dt : kDtypes) {
    const size_t esize = pstar::dtype_size(dt);
    std::vector<float> src32 = gradients(n, 77 + dt);
    src32[n / 3] = -0.0f;
    std::vector<uint8_t> src(n * esize);
    for (size_t i = 0; i < n; ++i) pstar::store_as(src.data(), dt, i, src32[i]);
    std::vector<uint8_t> want(n * esize);
    double want_sum = -1.0;
    int want_flag = -1;
    pstar::memory::host_grad_pack(HostKernelIsa::kScalar, want.data(), src.data(), dt, n, &want_sum, &want_flag);
    for (HostKernelIsa isa : paths()) {
      for (size_t offset : {size_t{0}, esize, size_t{32}}) {  // 32-byte aligned (non-temporal), not, aligned
        uint8_t* base = static_cast<uint8_t*>(std::aligned_alloc(64, (n * esize + 64 + 63) / 64 * 64));
        cr_assert_not_null(base);
        uint8_t* slot = base + offset;
        double sum = -1.0;
        int flag = -1;
        pstar::memory::host_grad_pack(isa, slot, src.data(), dt, n, &sum, &flag);
        cr_assert(std::memcmp(slot, want.data(), n * esize) == 0, "dtype %d offset %zu: packed values", dt, offset);
        cr_assert(bits(sum) == bits(want_sum), "dtype %d offset %zu: pack's squared sum", dt, offset);
        cr_assert_eq(flag, want_flag);
        std::vector<float> acc(n);
        pstar::memory::host_grad_accumulate(isa, acc.data(), src.data(), dt, n, true);
        std::memset(slot, 0xA5, n * esize);
        pstar::memory::host_grad_finalize(isa, acc.data(), slot, dt, n, &sum, &flag);
        cr_assert(std::memcmp(slot, want.data(), n * esize) == 0, "dtype %d offset %zu: finalized values", dt, offset);
        cr_assert(bits(sum) == bits(want_sum), "dtype %d offset %zu: finalize's squared sum", dt, offset);
        std::free(base);
      }
    }
  }
}
