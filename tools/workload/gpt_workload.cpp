// GPT-style workload: parameters and the schedule of one training iteration.
// The model and every assumption are described in gpt_workload.h.
#include "gpt_workload.h"

#include <algorithm>
#include <stdexcept>

namespace pstar::workload {

std::string validate(const GptShape& g) {
  if (g.layers == 0) return "layers must be at least 1";
  if (g.hidden == 0) return "hidden must be at least 1";
  if (g.heads == 0) return "heads must be at least 1";
  if (g.vocab == 0) return "vocab must be at least 1";
  if (g.seq == 0) return "seq must be at least 1";
  if (g.batch == 0) return "batch must be at least 1";
  if (g.hidden % g.heads != 0)
    return "hidden (" + std::to_string(g.hidden) + ") must be a multiple of heads (" + std::to_string(g.heads) + ")";
  if (g.dtype_bytes != 2 && g.dtype_bytes != 4) return "dtype bytes must be 2 or 4";
  if (g.logits_bytes != 2 && g.logits_bytes != 4) return "logits bytes must be 2 or 4";
  return {};
}

uint64_t gpt_param_count(const GptShape& g) {
  const uint64_t h = g.hidden;
  return uint64_t(g.vocab) * h + uint64_t(g.seq) * h + uint64_t(g.layers) * (12 * h * h + 13 * h) + 2 * h;
}

namespace {

// Byte figures of one micro-batch (see the header for the notation).
struct Sizes {
  uint64_t T, M, A, AM, logits, work_fwd, work_bwd, N;
  explicit Sizes(const GptShape& g) {
    const uint64_t s = g.seq, b = g.batch, h = g.hidden, a = g.heads;
    N = s * b;
    T = N * h * g.dtype_bytes;
    M = N * h;
    A = a * s * s * b * g.dtype_bytes;
    AM = a * s * s * b;
    logits = N * uint64_t(g.vocab) * g.logits_bytes;
    work_fwd = std::max(4 * T, A);
    work_bwd = T + std::max(4 * T, A);
  }
};

}  // namespace

uint64_t layer_activation_bytes(const GptShape& g) {
  const Sizes z(g);
  return 16 * z.T + 2 * z.M + 2 * z.A + z.AM;
}

Workload make_gpt(const GptShape& g) {
  const std::string problem = validate(g);
  if (!problem.empty()) throw std::invalid_argument("GPT shape: " + problem);

  Workload w;
  w.shape = g;
  const Sizes z(g);
  const int64_t h = g.hidden, V = g.vocab, s = g.seq;
  const double N = double(z.N), hd = double(h);

  auto add = [&](std::string name, std::vector<int64_t> shape, bool no_decay) {
    Param p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = 1;
    for (int64_t e : p.shape) p.numel *= uint64_t(e);
    p.no_weight_decay = no_decay;
    w.param_elems += p.numel;
    w.params.push_back(std::move(p));
    return uint32_t(w.params.size() - 1);
  };

  // One module of a layer: its weight and bias, forward FLOPs, and the bytes
  // it saves for backward (increment over what was saved before it).
  struct Module {
    uint32_t weight, bias;
    double flops;
    uint64_t saved;
  };

  const uint32_t wte = add("wte", {V, h}, false);
  const uint32_t wpe = add("wpe", {s, h}, false);
  std::vector<Module> modules;  // 6 per layer, layer-major
  modules.reserve(size_t(g.layers) * 6);
  const double attention_core = 4.0 * double(g.batch) * double(s) * double(s) * hd;
  for (uint32_t l = 0; l < g.layers; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    const uint32_t ln1w = add(p + "ln1.weight", {h}, true);
    const uint32_t ln1b = add(p + "ln1.bias", {h}, true);
    const uint32_t qkvw = add(p + "attn.qkv.weight", {3 * h, h}, false);
    const uint32_t qkvb = add(p + "attn.qkv.bias", {3 * h}, true);
    const uint32_t prjw = add(p + "attn.proj.weight", {h, h}, false);
    const uint32_t prjb = add(p + "attn.proj.bias", {h}, true);
    const uint32_t ln2w = add(p + "ln2.weight", {h}, true);
    const uint32_t ln2b = add(p + "ln2.bias", {h}, true);
    const uint32_t fcw = add(p + "mlp.fc.weight", {4 * h, h}, false);
    const uint32_t fcb = add(p + "mlp.fc.bias", {4 * h}, true);
    const uint32_t mpw = add(p + "mlp.proj.weight", {h, 4 * h}, false);
    const uint32_t mpb = add(p + "mlp.proj.bias", {h}, true);
    modules.push_back({ln1w, ln1b, 0.0, z.T});
    modules.push_back({qkvw, qkvb, 2.0 * 3 * hd * hd * N + attention_core, 4 * z.T + 2 * z.A + z.AM});
    modules.push_back({prjw, prjb, 2.0 * hd * hd * N, z.T + z.M});
    modules.push_back({ln2w, ln2b, 0.0, z.T});
    modules.push_back({fcw, fcb, 2.0 * 4 * hd * hd * N, 5 * z.T});
    modules.push_back({mpw, mpb, 2.0 * 4 * hd * hd * N, 4 * z.T + z.M});
  }
  const uint32_t lnfw = add("ln_f.weight", {h}, true);
  const uint32_t lnfb = add("ln_f.bias", {h}, true);

  uint64_t stored = 0;  // saved activations now
  auto use = [&](std::vector<uint32_t> params, Stage stage, double flops, uint64_t nonmodel) {
    Use u;
    u.params = std::move(params);
    u.stage = stage;
    u.flops = flops;
    u.nonmodel_bytes = nonmodel;
    u.grad_write = stage == Stage::Backward;
    w.moments += u.params.size();
    w.peak_nonmodel_bytes = std::max(w.peak_nonmodel_bytes, nonmodel);
    if (stage == Stage::Forward) w.flops_forward += flops;
    if (stage == Stage::Backward) w.flops_backward += flops;
    if (stage == Stage::Recompute) w.flops_recompute += flops;
    w.schedule.push_back(std::move(u));
  };
  // Forward-style use: saves `saved`, holds everything saved plus workspace.
  auto fwd = [&](std::vector<uint32_t> params, Stage stage, double flops, uint64_t saved) {
    stored += saved;
    use(std::move(params), stage, flops, stored + z.work_fwd);
  };
  // Backward use: holds what is saved (its own included) plus workspace,
  // then frees its saved tensors.
  auto bwd = [&](std::vector<uint32_t> params, double flops, uint64_t saved) {
    use(std::move(params), Stage::Backward, flops, stored + z.work_bwd);
    stored -= saved;
  };

  // ---- forward ----
  fwd({wte}, Stage::Forward, 0.0, 0);
  fwd({wpe}, Stage::Forward, 0.0, 0);
  for (uint32_t l = 0; l < g.layers; ++l) {
    const uint64_t before = stored;
    for (int k = 0; k < 6; ++k) {
      const Module& m = modules[size_t(l) * 6 + k];
      fwd({m.weight, m.bias}, Stage::Forward, m.flops, m.saved);
    }
    if (g.checkpointing) stored = before + z.T;  // only the layer's input stays
  }
  const double head_flops = 2.0 * double(V) * hd * N;
  fwd({lnfw, lnfb}, Stage::Forward, 0.0, z.T);
  fwd({wte}, Stage::Forward, head_flops, z.T + z.logits);

  // ---- backward ----
  bwd({wte}, 2.0 * head_flops, z.T + z.logits);
  bwd({lnfw, lnfb}, 0.0, z.T);
  for (uint32_t l = g.layers; l-- > 0;) {
    const Module* m = &modules[size_t(l) * 6];
    if (g.checkpointing) {
      // The layer's input is its checkpoint (already stored): ln1 saves
      // nothing new; the other modules save what they saved in forward.
      for (int k = 0; k < 6; ++k) fwd({m[k].weight, m[k].bias}, Stage::Recompute, m[k].flops, k == 0 ? 0 : m[k].saved);
    }
    for (int k = 6; k-- > 0;) bwd({m[k].weight, m[k].bias}, 2.0 * m[k].flops, m[k].saved);
  }
  bwd({wpe}, 0.0, 0);
  bwd({wte}, 0.0, 0);
  if (stored != 0) throw std::logic_error("GPT workload: activation bookkeeping does not return to zero");
  return w;
}

}  // namespace pstar::workload
