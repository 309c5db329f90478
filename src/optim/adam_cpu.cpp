// Instruction-set dispatch and the scalar path of the fused Adam update.
#include <cstdlib>
#include <cstring>

#include "optim/adam_kernel.h"
#include "util/dtype.h"
#include "util/error.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define PSTAR_X86_CPUID 1
#include <cpuid.h>
#else
#define PSTAR_X86_CPUID 0
#endif

namespace pstar::optim {

// The vector paths (adam_avx2.cpp, adam_avx512.cpp): call only when
// adam_isa_supported() says yes.  `native_bf16`: emit bf16 with AVX512-BF16's
// VCVTNEPS2BF16 (the CPU must have it) instead of the integer rounding; both
// give the same bits.
void adam_update_avx2(const AdamStepConstants& c, const AdamRange& r);
void adam_update_avx512(const AdamStepConstants& c, const AdamRange& r, bool native_bf16);

namespace {

struct CpuFeatures {
  bool avx2 = false;  // AVX2 + FMA + F16C (with OS support for the YMM state)
  // AVX-512 F + BW + VL + DQ, with the above (and ZMM state): every CPU with
  // BW has DQ (Skylake-SP and later, AMD Zen 4); the int8 quantizer uses DQ's
  // VREDUCEPS.
  bool avx512 = false;
  bool avx512bf16 = false;
  // AVX512-VBMI (VPERMB, VPERMI2B): the int8 dequantization through byte
  // planes (Ice Lake and later, AMD Zen 4; not Skylake-SP or Cooper Lake).
  bool avx512vbmi = false;
};

#if PSTAR_X86_CPUID
// F16C straight from CPUID (leaf 1, ECX bit 29): not every compiler's
// __builtin_cpu_supports knows "f16c" (clang 14 does not).  It uses the YMM
// state, whose OS support the "avx2" check below has established.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

// __builtin_cpu_supports checks the CPUID bits and that the OS saves the
// vector state (XCR0), so a feature it reports can be used.
CpuFeatures detect_cpu() {
  CpuFeatures f;
#if PSTAR_X86_CPUID
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  f.avx512bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  f.avx512vbmi = f.avx512 && __builtin_cpu_supports("avx512vbmi");
#endif
  return f;
}

const CpuFeatures& cpu() {
  static const CpuFeatures f = detect_cpu();
  return f;
}

void adam_update_scalar(const AdamStepConstants& c, const AdamRange& r) {
  const float* const pi = r.master_in != nullptr ? r.master_in : r.master;
  const float* const mi = r.exp_avg_in != nullptr ? r.exp_avg_in : r.exp_avg;
  const float* const vi = r.exp_avg_sq_in != nullptr ? r.exp_avg_sq_in : r.exp_avg_sq;
  for (size_t i = 0; i < r.n; ++i) {
    const float g = r.grad_f32 != nullptr ? r.grad_f32[i] : load_as(r.slot, r.dtype, i);
    float p = pi[i], m = mi[i], v = vi[i];
    const float w = adam_element(c, g, p, m, v);
    r.master[i] = p;
    r.exp_avg[i] = m;
    r.exp_avg_sq[i] = v;
    store_as(r.slot, r.dtype, i, w);
  }
}

}  // namespace

bool adam_isa_supported(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kScalar: return true;
    case AdamIsa::kAvx2: return cpu().avx2;
    case AdamIsa::kAvx512: return cpu().avx512;
  }
  return false;
}

bool cpu_has_avx512bf16() { return cpu().avx512bf16; }
bool cpu_has_avx512vbmi() { return cpu().avx512vbmi; }

const char* adam_isa_name(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kScalar: return "scalar";
    case AdamIsa::kAvx2: return "avx2";
    case AdamIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

AdamIsa adam_default_isa() {
  if (const char* want = std::getenv("PSTAR_ADAM_ISA")) {
    for (AdamIsa isa : {AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
      if (std::strcmp(want, adam_isa_name(isa)) == 0 && adam_isa_supported(isa)) return isa;
    }
  }
  for (AdamIsa isa : {AdamIsa::kAvx512, AdamIsa::kAvx2}) {
    if (adam_isa_supported(isa)) return isa;
  }
  return AdamIsa::kScalar;
}

void adam_update(AdamIsa isa, const AdamStepConstants& c, const AdamRange& r) {
  switch (isa) {
    case AdamIsa::kScalar: adam_update_scalar(c, r); return;
    case AdamIsa::kAvx2:
      if (!cpu().avx2) break;
      adam_update_avx2(c, r);
      return;
    case AdamIsa::kAvx512:
      if (!cpu().avx512) break;
      adam_update_avx512(c, r, cpu().avx512bf16);
      return;
  }
  internal_error(std::string("Adam path '") + adam_isa_name(isa) + "' is not available on this CPU");
}

}  // namespace pstar::optim
