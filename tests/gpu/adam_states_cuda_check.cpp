// GPU check of the CUDA kernels of the Adam state formats (issue 45,
// optim/adam_states_cuda.h), a plain C++ program (the GPU machine has no
// Criterion).  Exits 77 with "skipped: no CUDA device" where no GPU is usable.
//
//  1. The update against the scalar CPU reference adam_update_states(
//     AdamIsa::kScalar, ...), bit for bit, over several steps: fp32, bf16 and
//     int8 moments; f16, bf16 and f32 slots; the fp32 gradient list; in place
//     and out of place (ping-pong between two sets of lists); ragged lengths
//     (a last int8 block of n % 256 elements), ranges inside a longer list
//     (a block-aligned start; bf16 also unaligned, the one-element kernel);
//     blocks whose moments stay zero (absmax 0); and with bf16 masters
//     (optim/adam_masters_cuda.cu: stochastic rounding, every format, bf16
//     and f16 slots).  Every byte of every buffer is compared after every
//     step, inputs of the out-of-place update too.
//  2. The quantizer: int8_codes_cuda() against int8_code() on every float
//     within 256 ulps of every threshold of both maps (both signs, through
//     both maps), the maps' values, the special values, and a sample of all
//     2^32 bit patterns; int8_encode_cuda() against int8_encode() on blocks
//     with NaN, infinities, zeros, -0, subnormals and a ragged tail.
//  3. Bandwidth: each format on 2^28 elements (bf16 slots, in place) against
//     a device-to-device cudaMemcpy measured in the same run (bytes read +
//     written); one JSON line per format, on stdout and in
//     OUT_DIR/adam_states_cuda.json.
// Usage: adam_states_cuda_check [--quick] [OUT_DIR]
//   --quick: parts 1 and 2 without the 3M-element ranges (the only ones
//   long enough for the kernels' grid-stride loops to turn), no part 3 (for
//   compute-sanitizer).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "memory/cuda_device.h"
#include "optim/adam_states.h"
#include "optim/adam_states_cuda.h"
#include "optim/adam_states_int8.h"
#include "util/dtype.h"

using namespace pstar;
using namespace pstar::optim;

namespace {

int passes = 0, failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
  } else {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

#define CU(call)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// A host buffer and its device twin.
struct Buf {
  std::vector<unsigned char> host;
  void* dev = nullptr;
  std::string name;
  explicit Buf(std::string n, size_t bytes) : host(bytes), name(std::move(n)) {
    CU(cudaMalloc(&dev, std::max<size_t>(bytes, 1)));
  }
  ~Buf() { cudaFree(dev); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void upload() { CU(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice)); }
  // The first byte where the device differs from the host; SIZE_MAX if none.
  size_t first_difference() const {
    std::vector<unsigned char> d(host.size());
    CU(cudaMemcpy(d.data(), dev, d.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < d.size(); ++i) {
      if (d[i] != host[i]) {
        std::fprintf(stderr, "  %s: byte %zu: gpu 0x%02x cpu 0x%02x\n", name.c_str(), i, d[i], host[i]);
        return i;
      }
    }
    return SIZE_MAX;
  }
  float* hf() { return reinterpret_cast<float*>(host.data()); }
  float* df() { return static_cast<float*>(dev); }
};

struct Case {
  StateFormat f;
  pstar_dtype dtype;
  bool grad_list;
  bool oop;
  size_t n_total, lo, n;
  int steps;
  bool bf16_masters = false;  // optim/adam_masters.h: bf16 masters, stochastic rounding
};

std::string describe(const Case& k) {
  return std::string(state_format_name(k.f)) + " " + dtype_name(k.dtype) + (k.grad_list ? " +fp32 grads" : "") +
         (k.oop ? " out of place" : " in place") + ", list " + std::to_string(k.n_total) + ", range [" +
         std::to_string(k.lo) + ", " + std::to_string(k.lo + k.n) + ")" + (k.bf16_masters ? ", bf16 masters" : "");
}

// Block b's scale of gradients and initial moments: 1e-2 .. 1e-6; every
// 11th block (from the 5th) is all zeros (its absmax stays 0 in int8).
float block_scale(size_t e) {
  const size_t b = e / kInt8BlockElems;
  if (b % 11 == 5) return 0.0f;
  return std::pow(10.0f, -static_cast<float>(2 + b % 5));
}

void bit_identity(const Case& k) {
  std::mt19937 rng(static_cast<unsigned>(k.n_total * 131 + k.lo * 7 + k.n + static_cast<unsigned>(k.f) * 3 + k.dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t eb = dtype_size(k.dtype);
  const size_t lb = moment_list_bytes(k.f, k.n_total);
  const int sets = k.oop ? 2 : 1;
  std::vector<Buf*> master, m, v;
  for (int s = 0; s < sets; ++s) {
    master.push_back(new Buf("master[" + std::to_string(s) + "]", k.n_total * (k.bf16_masters ? 2 : 4)));
    m.push_back(new Buf("exp_avg[" + std::to_string(s) + "]", lb));
    v.push_back(new Buf("exp_avg_sq[" + std::to_string(s) + "]", lb));
  }
  Buf slot("slot", k.n_total * eb), g32("grad_f32", k.n_total * 4);
  // Initial state: random masters and moments (zero in the zero blocks); the
  // second set of an out-of-place case starts as a byte pattern.
  std::vector<float> mf(k.n_total), vf(k.n_total);
  for (size_t i = 0; i < k.n_total; ++i) {
    if (k.bf16_masters) {
      reinterpret_cast<uint16_t*>(master[0]->host.data())[i] = f32_to_bf16(normal(rng) * 0.1f);
    } else {
      master[0]->hf()[i] = normal(rng) * 0.1f;
    }
    const float s = block_scale(i);
    mf[i] = normal(rng) * s;
    vf[i] = mf[i] * mf[i] * (1.0f + std::fabs(normal(rng)));
  }
  moments_from_f32(k.f, false, m[0]->host.data(), k.n_total, 0, k.n_total, mf.data());
  moments_from_f32(k.f, true, v[0]->host.data(), k.n_total, 0, k.n_total, vf.data());
  if (k.oop) {
    std::fill(master[1]->host.begin(), master[1]->host.end(), 0xa5);
    std::fill(m[1]->host.begin(), m[1]->host.end(), 0x5a);
    std::fill(v[1]->host.begin(), v[1]->host.end(), 0x3c);
  }
  std::vector<Buf*> all = {&slot, &g32};
  for (int s = 0; s < sets; ++s) all.insert(all.end(), {master[s], m[s], v[s]});
  for (Buf* b : all) b->upload();

  AdamHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.01f;
  bool same = true;
  for (int step = 1; step <= k.steps && same; ++step) {
    for (size_t i = 0; i < k.n_total; ++i) {
      const float g = normal(rng) * block_scale(i);
      g32.hf()[i] = g;
      store_as(slot.host.data(), k.dtype, i, g * 1024.0f);
    }
    if (step == 2 && k.n_total > 3) {  // a subnormal gradient
      g32.hf()[3] = 1e-40f;
      if (k.dtype == PSTAR_DTYPE_F32) store_as(slot.host.data(), k.dtype, 3, 1e-40f);
    }
    slot.upload();
    g32.upload();
    // Both flavours; AdamW first, so that the zero blocks (no gradient, no
    // moments) stay zero at step 1 (absmax 0) and L2 makes them nonzero at 2.
    h.adamw = (step % 2) == 1;
    const AdamStepConstants c = adam_constants(h, static_cast<uint64_t>(step), 1.0 / 1024.0, true);
    const int in = k.oop ? (step + 1) % 2 : 0, out = k.oop ? step % 2 : 0;
    auto range = [&](bool dev) {
      auto p = [&](Buf* b) { return dev ? b->dev : static_cast<void*>(b->host.data()); };
      AdamStateRange r;
      r.master = static_cast<float*>(p(master[out])) + k.lo;
      r.exp_avg = moment_list_at(k.f, p(m[out]), k.n_total, k.lo);
      r.exp_avg_sq = moment_list_at(k.f, p(v[out]), k.n_total, k.lo);
      if (k.oop) {
        r.master_in = static_cast<const float*>(p(master[in])) + k.lo;
        r.exp_avg_in = moment_list_at(k.f, static_cast<const void*>(p(m[in])), k.n_total, k.lo);
        r.exp_avg_sq_in = moment_list_at(k.f, static_cast<const void*>(p(v[in])), k.n_total, k.lo);
      }
      r.slot = static_cast<char*>(p(&slot)) + k.lo * eb;
      r.dtype = k.dtype;
      r.grad_f32 = k.grad_list ? static_cast<const float*>(p(&g32)) + k.lo : nullptr;
      r.n = k.n;
      if (k.bf16_masters) {
        r.bf16.master = static_cast<uint16_t*>(p(master[out])) + k.lo;
        if (k.oop) r.bf16.master_in = static_cast<const uint16_t*>(p(master[in])) + k.lo;
        r.bf16.stream = sr_stream(7, static_cast<uint64_t>(step), 3);
        r.bf16.offset = 100 + k.lo;
      }
      return r;
    };
    adam_update_states(AdamIsa::kScalar, k.f, c, range(false));
    adam_update_states_cuda(nullptr, k.f, c, range(true));
    CU(cudaDeviceSynchronize());
    for (Buf* b : all) {
      if (b->first_difference() != SIZE_MAX) {
        std::fprintf(stderr, "  (step %d of %s)\n", step, describe(k).c_str());
        same = false;
      }
    }
  }
  expect(same, "CUDA update bit-identical to the scalar reference: " + describe(k));
  for (int s = 0; s < sets; ++s) {
    delete master[s];
    delete m[s];
    delete v[s];
  }
}

// ---- the quantizer ------------------------------------------------------------

float from_bits(uint32_t u) { return f32_from_bits(u); }

void quantizer() {
  std::vector<float> y;
  for (bool s : {true, false}) {
    const int8::Map& map = int8::map_of(s);
    for (int k = 0; k < map.n_thr; ++k) {
      const uint32_t t = f32_bits(map.thr[k]);
      for (int d = -256; d <= 256; ++d) {
        const float x = from_bits(t + static_cast<uint32_t>(d));
        y.push_back(x);
        y.push_back(-x);
      }
    }
    for (int k = 0; k < 256; ++k) {
      const uint32_t t = f32_bits(map.values[k]);
      for (int d = -8; d <= 8; ++d) y.push_back(from_bits(t + static_cast<uint32_t>(d)));
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x :
       {0.0f, inf, std::numeric_limits<float>::denorm_min(), from_bits(0x007fffffu), std::numeric_limits<float>::min(),
        std::numeric_limits<float>::max(), 1.0f, 1.5f, 2.0f, 1e30f, 0.99297f, 0.995f, 0.5f, 1e-7f, 1e-30f}) {
    y.push_back(x);
    y.push_back(-x);
  }
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu}) {
    y.push_back(from_bits(nan));
  }
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4093) y.push_back(from_bits(static_cast<uint32_t>(u)));

  const size_t n = y.size();
  float* dy;
  uint8_t* dc;
  CU(cudaMalloc(&dy, n * 4));
  CU(cudaMalloc(&dc, n));
  CU(cudaMemcpy(dy, y.data(), n * 4, cudaMemcpyHostToDevice));
  for (bool s : {true, false}) {
    int8_codes_cuda(nullptr, s, dy, n, dc);
    std::vector<uint8_t> got(n);
    CU(cudaMemcpy(got.data(), dc, n, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t want = int8_code(s, y[i]);
      if (got[i] != want) {
        if (bad < 5) {
          std::fprintf(stderr, "  %s map: y 0x%08x (%.9g): gpu code %u, cpu %u\n", s ? "signed" : "unsigned",
                       f32_bits(y[i]), y[i], got[i], want);
        }
        ++bad;
      }
    }
    expect(bad == 0, std::string("int8_codes_cuda equals int8_code on ") + std::to_string(n) + " floats, " +
                         (s ? "signed" : "unsigned") + " map (" + std::to_string(bad) + " differ)");
  }
  cudaFree(dy);
  cudaFree(dc);

  // Blockwise encode: blocks of special contents and a ragged tail.
  std::mt19937 rng(45);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t ne = 12 * kInt8BlockElems + 77;
  std::vector<float> x(ne);
  for (size_t i = 0; i < ne; ++i) {
    const size_t b = i / kInt8BlockElems, j = i % kInt8BlockElems;
    float val = normal(rng);
    switch (b) {
      case 0: val = 0.0f; break;                                                   // all zeros: absmax 0
      case 1: val = j % 2 ? -0.0f : 0.0f; break;                                   // signed zeros
      case 2: val = j % 3 ? val : std::numeric_limits<float>::quiet_NaN(); break;  // NaN never wins
      case 3: val = std::numeric_limits<float>::quiet_NaN(); break;                // all NaN: absmax 0
      case 4: val = j == 17 ? inf : val; break;                                    // +inf: factor 0
      case 5: val = j == 200 ? -inf : val; break;
      case 6: val *= 1e-40f; break;  // subnormals: 1 / absmax = inf
      case 7: val *= 1e-38f; break;
      case 8: val = j == 0 ? std::numeric_limits<float>::max() : val; break;
      case 9: val = std::fabs(val) * -1.0f; break;  // negatives (unsigned: code 0)
      default: val *= std::pow(10.0f, -static_cast<float>(b % 6)); break;
    }
    x[i] = val;
  }
  const size_t nb = int8_blocks(ne);
  float *dx, *da;
  uint8_t* dcodes;
  CU(cudaMalloc(&dx, ne * 4));
  CU(cudaMalloc(&da, nb * 4));
  CU(cudaMalloc(&dcodes, ne));
  CU(cudaMemcpy(dx, x.data(), ne * 4, cudaMemcpyHostToDevice));
  for (bool s : {true, false}) {
    std::vector<uint8_t> want_c(ne), got_c(ne);
    std::vector<float> want_a(nb), got_a(nb);
    int8_encode(AdamIsa::kScalar, s, x.data(), ne, want_c.data(), want_a.data());
    int8_encode_cuda(nullptr, s, dx, ne, dcodes, da);
    CU(cudaMemcpy(got_c.data(), dcodes, ne, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(got_a.data(), da, nb * 4, cudaMemcpyDeviceToHost));
    const bool same =
        std::memcmp(got_c.data(), want_c.data(), ne) == 0 && std::memcmp(got_a.data(), want_a.data(), nb * 4) == 0;
    if (!same) {
      for (size_t b = 0; b < nb; ++b) {
        if (f32_bits(got_a[b]) != f32_bits(want_a[b])) {
          std::fprintf(stderr, "  absmax[%zu]: gpu 0x%08x cpu 0x%08x\n", b, f32_bits(got_a[b]), f32_bits(want_a[b]));
        }
      }
      for (size_t i = 0; i < ne; ++i) {
        if (got_c[i] != want_c[i]) {
          std::fprintf(stderr, "  code[%zu] (x 0x%08x): gpu %u cpu %u\n", i, f32_bits(x[i]), got_c[i], want_c[i]);
          break;
        }
      }
    }
    expect(same, std::string("int8_encode_cuda equals int8_encode, ") + (s ? "signed" : "unsigned") + " map");
  }
  cudaFree(dx);
  cudaFree(da);
  cudaFree(dcodes);
}

// ---- bandwidth ------------------------------------------------------------------

template <class F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  f();  // warm-up
  CU(cudaDeviceSynchronize());
  for (int i = 0; i < reps; ++i) {
    CU(cudaEventRecord(a));
    f();
    CU(cudaEventRecord(b));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

void bandwidth(const std::string& out_dir, const char* device) {
  const size_t n = size_t{1} << 28;
  const size_t lb = moment_list_bytes(StateFormat::kFp32, n);  // the largest format
  void *master, *m, *v, *slot;
  CU(cudaMalloc(&master, n * 4));
  CU(cudaMalloc(&m, lb));
  CU(cudaMalloc(&v, lb));
  CU(cudaMalloc(&slot, n * 2));
  // Random masters and bf16 gradients: 2^20 elements copied over the range.
  const size_t piece = size_t{1} << 20;
  {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p(piece);
    std::vector<uint16_t> g(piece);
    for (size_t i = 0; i < piece; ++i) {
      p[i] = normal(rng) * 0.1f;
      g[i] = f32_to_bf16(normal(rng) * 1e-2f);
    }
    CU(cudaMemcpy(master, p.data(), piece * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(slot, g.data(), piece * 2, cudaMemcpyHostToDevice));
    for (size_t off = piece; off < n; off += piece) {
      CU(cudaMemcpy(static_cast<float*>(master) + off, master, piece * 4, cudaMemcpyDeviceToDevice));
      CU(cudaMemcpy(static_cast<uint16_t*>(slot) + off, slot, piece * 2, cudaMemcpyDeviceToDevice));
    }
  }
  // Device-to-device copy of 1 GiB: reads and writes 2 GiB in all.
  const size_t copy_bytes = size_t{1} << 30;
  const double d2d_ms = median_ms(9, [&] { CU(cudaMemcpyAsync(m, master, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double d2d_gbs = 2.0 * copy_bytes / (d2d_ms * 1e6);
  AdamHyper h;
  const AdamStepConstants c = adam_constants(h, 1, 1.0, true);
  std::string lines;
  double fp32_eps = 0;
  for (StateFormat f : {StateFormat::kFp32, StateFormat::kBf16, StateFormat::kInt8}) {
    CU(cudaMemset(m, 0, lb));  // a zero state in every format
    CU(cudaMemset(v, 0, lb));
    AdamStateRange r;
    r.master = static_cast<float*>(master);
    r.exp_avg = moment_list_at(f, m, n, 0);
    r.exp_avg_sq = moment_list_at(f, v, n, 0);
    r.slot = slot;
    r.dtype = PSTAR_DTYPE_BF16;
    r.n = n;
    const double ms = median_ms(9, [&] { adam_update_states_cuda(nullptr, f, c, r); });
    const double eps = n / (ms * 1e-3);
    const double bpe = adam_state_bytes_per_elem(f, PSTAR_DTYPE_BF16, false);
    const double gbs = eps * bpe / 1e9;
    if (f == StateFormat::kFp32) fp32_eps = eps;
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"adam_states_cuda\",\"device\":\"%s\",\"state_format\":\"%s\",\"dtype\":\"bf16\","
                  "\"elements\":%zu,\"median_ms\":%.4f,\"elems_per_s\":%.4g,\"bytes_per_elem\":%.4f,\"gbs\":%.1f,"
                  "\"d2d_gbs\":%.1f,\"fraction_of_memcpy\":%.4f,\"vs_fp32\":%.3f}\n",
                  device, state_format_name(f), n, ms, eps, bpe, gbs, d2d_gbs, gbs / d2d_gbs, eps / fp32_eps);
    std::fputs(line, stdout);
    lines += line;
  }
  const std::string path = out_dir + "/adam_states_cuda.json";
  if (FILE* fp = std::fopen(path.c_str(), "w")) {
    std::fputs(lines.c_str(), fp);
    std::fclose(fp);
  }
  cudaFree(master);
  cudaFree(m);
  cudaFree(v);
  cudaFree(slot);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string out_dir = ".";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      out_dir = argv[i];
    }
  }
  if (memory::cuda_runtime_device_count() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);

  quantizer();

  const StateFormat formats[] = {StateFormat::kFp32, StateFormat::kBf16, StateFormat::kInt8};
  for (StateFormat f : formats) {
    for (pstar_dtype d : {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16, PSTAR_DTYPE_F32}) {
      for (bool oop : {false, true}) {
        for (size_t n : {size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{4097}}) {
          bit_identity({f, d, false, oop, n, 0, n, 6});
        }
        bit_identity({f, d, true, oop, 4097, 0, 4097, 6});
        // A range inside a longer list, from a block boundary, ending in a
        // partial block (3001 = 11 * 256 + 185).
        bit_identity({f, d, false, oop, 5000, 512, 3001, 6});
        bit_identity({f, d, true, oop, 5000, 512, 3001, 6});
        // Unaligned starts (bf16 and fp32 only: int8 ranges start on blocks):
        // the one-element kernels and the vector kernels' tails.
        if (f != StateFormat::kInt8) {
          bit_identity({f, d, false, oop, 5000, 3, 3001, 4});
          bit_identity({f, d, true, oop, 5000, 4, 3002, 4});
        }
      }
    }
    // bf16 masters: widened, updated, rounded stochastically on the device.
    for (pstar_dtype d : {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16}) {
      for (bool oop : {false, true}) {
        bit_identity({f, d, false, oop, 5000, 512, 3001, 4, true});
        bit_identity({f, d, true, oop, 4097, 0, 4097, 4, true});
      }
    }
    if (!quick) {
      for (bool oop : {false, true}) bit_identity({f, PSTAR_DTYPE_BF16, false, oop, 3000017, 0, 3000017, 3});
    }
  }

  if (!quick) bandwidth(out_dir, prop.name);
  std::printf("%d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
