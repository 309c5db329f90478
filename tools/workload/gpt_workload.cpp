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
  if (g.kind == ModelKind::kGpt && g.vocab == 0) return "vocab must be at least 1";
  if (g.kind == ModelKind::kVit && (g.patch == 0 || g.channels == 0 || g.classes == 0))
    return "patch, channels and classes must be at least 1";
  if (g.kind == ModelKind::kVit && g.seq < 2) return "a ViT's seq (patches + class token) must be at least 2";
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
  if (g.kind == ModelKind::kVit)
    return h + h * (uint64_t(g.channels) * g.patch * g.patch + 1) + uint64_t(g.seq) * h +
           uint64_t(g.layers) * (12 * h * h + 13 * h) + 2 * h + uint64_t(g.classes) * (h + 1);
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
    logits =
        g.kind == ModelKind::kVit ? b * uint64_t(g.classes) * g.logits_bytes : N * uint64_t(g.vocab) * g.logits_bytes;
    work_fwd = std::max(4 * T, A);
    work_bwd = T + std::max(4 * T, A);
  }
};

}  // namespace

uint64_t layer_activation_bytes(const GptShape& g) {
  const Sizes z(g);
  return 16 * z.T + 2 * z.M + 2 * z.A + z.AM;
}

namespace {

// Builds a Workload: parameters in registration order, uses in schedule
// order, and the activation bookkeeping of the header.
struct Builder {
  Workload w;
  Sizes z;
  uint64_t stored = 0;  // saved activations now

  // One module of a layer: its weight and bias, forward FLOPs, and the
  // bytes it saves for backward (increment over what was saved before it).
  struct Module {
    uint32_t weight, bias;
    double flops;
    uint64_t saved;
  };
  std::vector<Module> modules;  // 6 per layer, layer-major

  explicit Builder(const GptShape& g) : z(g) { w.shape = g; }

  uint32_t add(std::string name, std::vector<int64_t> shape, bool no_decay) {
    Param p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = 1;
    for (int64_t e : p.shape) p.numel *= uint64_t(e);
    p.no_weight_decay = no_decay;
    w.param_elems += p.numel;
    w.params.push_back(std::move(p));
    return uint32_t(w.params.size() - 1);
  }

  // The transformer layers' parameters (pre-LayerNorm; GPT-2 and ViT share
  // the layout), names prefixed by prefix(l).
  template <class Prefix>
  void add_layers(Prefix&& prefix) {
    const GptShape& g = w.shape;
    const int64_t h = g.hidden;
    const double N = double(z.N), hd = double(h);
    const double attention_core = 4.0 * double(g.batch) * double(g.seq) * double(g.seq) * hd;
    modules.reserve(size_t(g.layers) * 6);
    for (uint32_t l = 0; l < g.layers; ++l) {
      const std::string p = prefix(l);
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
  }

  void use(std::vector<uint32_t> params, Stage stage, double flops, uint64_t nonmodel) {
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
  }
  // Forward-style use: saves `saved`, holds everything saved plus workspace.
  void fwd(std::vector<uint32_t> params, Stage stage, double flops, uint64_t saved) {
    stored += saved;
    use(std::move(params), stage, flops, stored + z.work_fwd);
  }
  // Backward use: holds what is saved (its own included) plus workspace,
  // then frees its saved tensors.
  void bwd(std::vector<uint32_t> params, double flops, uint64_t saved) {
    use(std::move(params), Stage::Backward, flops, stored + z.work_bwd);
    stored -= saved;
  }

  // A layer's uses: its modules one by one; a ViT's attention is one call
  // (torch's nn.MultiheadAttention hands the qkv and the output projection
  // to one function), so its two projections are one use.
  std::vector<std::vector<int>> layer_uses() const {
    if (w.shape.kind == ModelKind::kVit) return {{0}, {1, 2}, {3}, {4}, {5}};
    return {{0}, {1}, {2}, {3}, {4}, {5}};
  }
  struct LayerUse {
    std::vector<uint32_t> params;
    double flops = 0.0;
    uint64_t saved = 0;
  };
  LayerUse layer_use(uint32_t l, const std::vector<int>& ks) const {
    LayerUse u;
    for (int k : ks) {
      const Module& m = modules[size_t(l) * 6 + k];
      u.params.push_back(m.weight);
      u.params.push_back(m.bias);
      u.flops += m.flops;
      u.saved += m.saved;
    }
    return u;
  }

  void layers_forward() {
    for (uint32_t l = 0; l < w.shape.layers; ++l) {
      const uint64_t before = stored;
      for (const auto& ks : layer_uses()) {
        LayerUse u = layer_use(l, ks);
        fwd(std::move(u.params), Stage::Forward, u.flops, u.saved);
      }
      if (w.shape.checkpointing) stored = before + z.T;  // only the layer's input stays
    }
  }
  void layers_backward() {
    const auto uses = layer_uses();
    for (uint32_t l = w.shape.layers; l-- > 0;) {
      if (w.shape.checkpointing) {
        // The layer's input is its checkpoint (already stored): ln1 saves
        // nothing new; the other modules save what they saved in forward.
        for (size_t i = 0; i < uses.size(); ++i) {
          LayerUse u = layer_use(l, uses[i]);
          fwd(std::move(u.params), Stage::Recompute, u.flops, i == 0 ? 0 : u.saved);
        }
      }
      for (size_t i = uses.size(); i-- > 0;) {
        LayerUse u = layer_use(l, uses[i]);
        bwd(std::move(u.params), 2.0 * u.flops, u.saved);
      }
    }
  }

  Workload finish(const char* what) {
    if (stored != 0) throw std::logic_error(std::string(what) + ": activation bookkeeping does not return to zero");
    return std::move(w);
  }
};

}  // namespace

Workload make_gpt(const GptShape& g) {
  const std::string problem = validate(g);
  if (!problem.empty()) throw std::invalid_argument("GPT shape: " + problem);
  if (g.kind != ModelKind::kGpt) throw std::invalid_argument("make_gpt: the shape is not a GPT's");
  Builder b(g);
  const Sizes& z = b.z;
  const int64_t h = g.hidden, V = g.vocab, s = g.seq;

  const uint32_t wte = b.add("wte", {V, h}, false);
  const uint32_t wpe = b.add("wpe", {s, h}, false);
  b.add_layers([](uint32_t l) { return "h" + std::to_string(l) + "."; });
  const uint32_t lnfw = b.add("ln_f.weight", {h}, true);
  const uint32_t lnfb = b.add("ln_f.bias", {h}, true);

  // ---- forward ----
  b.fwd({wte}, Stage::Forward, 0.0, 0);
  b.fwd({wpe}, Stage::Forward, 0.0, 0);
  b.layers_forward();
  const double head_flops = 2.0 * double(V) * double(h) * double(z.N);
  b.fwd({lnfw, lnfb}, Stage::Forward, 0.0, z.T);
  b.fwd({wte}, Stage::Forward, head_flops, z.T + z.logits);

  // ---- backward ----
  b.bwd({wte}, 2.0 * head_flops, z.T + z.logits);
  b.bwd({lnfw, lnfb}, 0.0, z.T);
  b.layers_backward();
  b.bwd({wpe}, 0.0, 0);
  b.bwd({wte}, 0.0, 0);
  return b.finish("GPT workload");
}

Workload make_vit(const GptShape& g) {
  const std::string problem = validate(g);
  if (!problem.empty()) throw std::invalid_argument("ViT shape: " + problem);
  if (g.kind != ModelKind::kVit) throw std::invalid_argument("make_vit: the shape is not a ViT's");
  Builder b(g);
  const Sizes& z = b.z;
  const int64_t h = g.hidden, s = g.seq, P = g.patch, C = g.channels, K = g.classes;
  const double N = double(z.N), patches = double(g.batch) * double(s - 1);

  // Registration order as torchvision's VisionTransformer: the class token
  // and the position embedding are parameters of no submodule.
  const uint32_t cls = b.add("class_token", {1, 1, h}, false);
  const uint32_t convw = b.add("conv_proj.weight", {h, C, P, P}, false);
  const uint32_t convb = b.add("conv_proj.bias", {h}, true);
  const uint32_t pos = b.add("encoder.pos_embedding", {1, s, h}, false);
  b.add_layers([](uint32_t l) { return "encoder.layers.encoder_layer_" + std::to_string(l) + "."; });
  const uint32_t lnw = b.add("encoder.ln.weight", {h}, true);
  const uint32_t lnb = b.add("encoder.ln.bias", {h}, true);
  const uint32_t headw = b.add("heads.head.weight", {K, h}, false);
  const uint32_t headb = b.add("heads.head.bias", {K}, true);

  // ---- forward: patches, class token, position embedding, layers, head ----
  const double conv_flops = 2.0 * double(h) * double(C * P * P) * patches;
  const double head_flops = 2.0 * double(K) * double(h) * double(g.batch);  // the class token's row only
  b.fwd({convw, convb}, Stage::Forward, conv_flops, 0);
  b.fwd({cls}, Stage::Forward, 0.0, 0);
  b.fwd({pos}, Stage::Forward, 0.0, 0);
  b.layers_forward();
  b.fwd({lnw, lnb}, Stage::Forward, 0.0, z.T);
  b.fwd({headw, headb}, Stage::Forward, head_flops, z.logits);

  // ---- backward ----
  b.bwd({headw, headb}, 2.0 * head_flops, z.logits);
  b.bwd({lnw, lnb}, 0.0, z.T);
  b.layers_backward();
  b.bwd({pos}, 0.0, 0);
  b.bwd({cls}, 0.0, 0);
  b.bwd({convw, convb}, 2.0 * conv_flops, 0);
  (void)N;
  return b.finish("ViT workload");
}

Workload make_workload(const GptShape& g) { return g.kind == ModelKind::kVit ? make_vit(g) : make_gpt(g); }

}  // namespace pstar::workload
