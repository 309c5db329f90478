// The int8 Adam state format (optim/adam_states.h) driven from raw files,
// for tests/optim/test_bnb_pin.py, which runs the same inputs through
// bitsandbytes' AdamW8bit and compares.
//
//   adam_states_io maps OUT
//     OUT: the signed then the unsigned dynamic map, 256 float32 each.
//   adam_states_io run IN OUT
//     IN:  "PSTARIO1", uint64 n, uint64 steps, float32 lr, beta1, beta2,
//          eps, weight_decay; float32 master[n]; float32 grad[steps][n].
//     OUT: per step t = 1..steps: float32 master[n], uint8 m codes[n],
//          uint8 v codes[n], float32 m absmax[blocks], float32 v absmax[blocks]
//          (blocks = ceil(n / 256)).
//   The update is AdamW (decoupled weight decay) on one parameter, its
//   gradient from an fp32 list, the moments starting at zero (zero-filled
//   lists), the best instruction set of this CPU (PSTAR_ADAM_ISA picks
//   another).
//
// Exit status 0 on success, 2 on bad arguments or files.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "optim/adam_states.h"

using namespace pstar::optim;

namespace {

bool read_all(std::FILE* f, void* dst, size_t bytes) { return std::fread(dst, 1, bytes, f) == bytes; }
bool write_all(std::FILE* f, const void* src, size_t bytes) { return std::fwrite(src, 1, bytes, f) == bytes; }

int maps(const char* out) {
  std::FILE* f = std::fopen(out, "wb");
  if (f == nullptr) return 2;
  const bool ok = write_all(f, int8_dynamic_map(true), 256 * sizeof(float)) &&
                  write_all(f, int8_dynamic_map(false), 256 * sizeof(float));
  return std::fclose(f) == 0 && ok ? 0 : 2;
}

int run(const char* in, const char* out) {
  std::FILE* f = std::fopen(in, "rb");
  if (f == nullptr) {
    std::fprintf(stderr, "adam_states_io: cannot open %s\n", in);
    return 2;
  }
  char magic[8];
  uint64_t n = 0, steps = 0;
  float hp[5];
  bool ok = read_all(f, magic, 8) && std::memcmp(magic, "PSTARIO1", 8) == 0 && read_all(f, &n, 8) &&
            read_all(f, &steps, 8) && read_all(f, hp, sizeof hp) && n > 0 && n < (uint64_t{1} << 32) && steps > 0 &&
            steps < 100000;
  std::vector<float> master(ok ? n : 0), grads(ok ? n * steps : 0);
  ok = ok && read_all(f, master.data(), n * sizeof(float)) && read_all(f, grads.data(), n * steps * sizeof(float));
  std::fclose(f);
  if (!ok) {
    std::fprintf(stderr, "adam_states_io: %s is not a well-formed input\n", in);
    return 2;
  }
  AdamHyper h;
  h.lr = hp[0];
  h.beta1 = hp[1];
  h.beta2 = hp[2];
  h.eps = hp[3];
  h.weight_decay = hp[4];
  h.adamw = true;
  const StateFormat fmt = StateFormat::kInt8;
  std::vector<uint8_t> m(moment_list_bytes(fmt, n), 0), v(moment_list_bytes(fmt, n), 0);
  std::vector<float> slot(n);
  const size_t blocks = int8_blocks(n);
  std::FILE* o = std::fopen(out, "wb");
  if (o == nullptr) {
    std::fprintf(stderr, "adam_states_io: cannot write %s\n", out);
    return 2;
  }
  const AdamIsa isa = adam_default_isa();
  for (uint64_t t = 1; t <= steps; ++t) {
    AdamStateRange r;
    r.master = master.data();
    r.exp_avg = moment_list_at(fmt, m.data(), n, 0);
    r.exp_avg_sq = moment_list_at(fmt, v.data(), n, 0);
    r.slot = slot.data();
    r.dtype = PSTAR_DTYPE_F32;
    r.grad_f32 = grads.data() + (t - 1) * n;
    r.n = n;
    adam_update_states(isa, fmt, adam_constants(h, t, 1.0, true), r);
    ok = ok && write_all(o, master.data(), n * sizeof(float)) && write_all(o, r.exp_avg.values, n) &&
         write_all(o, r.exp_avg_sq.values, n) && write_all(o, r.exp_avg.absmax, blocks * sizeof(float)) &&
         write_all(o, r.exp_avg_sq.absmax, blocks * sizeof(float));
  }
  ok = std::fclose(o) == 0 && ok;
  std::fprintf(stderr, "adam_states_io: %llu elements, %llu steps, isa %s\n", static_cast<unsigned long long>(n),
               static_cast<unsigned long long>(steps), adam_isa_name(isa));
  return ok ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "maps") == 0) return maps(argv[2]);
  if (argc == 4 && std::strcmp(argv[1], "run") == 0) return run(argv[2], argv[3]);
  std::fprintf(stderr, "usage: adam_states_io maps OUT | adam_states_io run IN OUT\n");
  return 2;
}
