// A GPT-style model as the planner sees it: the parameters in registration
// order, and one training iteration as a schedule of parameter uses with
// their compute (FLOPs) and the activation memory held on the accelerator.
//
// Model (GPT-2 layout, pre-LayerNorm):
//   token embedding wte [V, h]      tied with the output head (used twice)
//   position embedding wpe [s, h]
//   per layer l: ln1 {weight, bias} [h]; attention qkv {weight [3h, h],
//     bias [3h]}; attention output projection {weight [h, h], bias [h]};
//     ln2 {weight, bias} [h]; MLP fc {weight [4h, h], bias [4h]};
//     MLP projection {weight [h, 4h], bias [h]}
//   final LayerNorm ln_f {weight, bias} [h]
//   Parameters = V h + s h + L (12 h^2 + 13 h) + 2 h.
//   Biases and LayerNorm parameters are registered without weight decay.
//
// Schedule of one TRAIN iteration (one micro-batch): a "use" acquires one
// module's parameters together (weight and bias; one moment per acquire),
// computes, writes gradients in backward, releases them.
//   forward:   wte (embedding), wpe, layers 0..L-1 (ln1, qkv + attention
//              core, attention projection, ln2, fc + GeLU, MLP projection),
//              ln_f, wte (output head: logits and loss)
//   backward:  wte (head), ln_f, then for each layer L-1..0: with
//              activation checkpointing its six uses again in forward order
//              as RECOMPUTE, then its six uses in reverse as BACKWARD; last
//              wpe and wte (embedding).
//   The tied wte therefore has two FORWARD and two BACKWARD uses; its
//   gradient buffer lives from the head's backward to the embedding's.
//
// FLOPs (multiply-add = 2 FLOPs; N = s b tokens):
//   a weight matrix of n elements: 2 n N forward, 4 n N backward, 2 n N
//   recompute; the output head is the matrix wte (2 V h N forward);
//   attention core per layer: Q K^T and the product with V, 4 b s^2 h
//   forward (counted on the qkv use), twice that backward;
//   embeddings, biases, LayerNorms, GeLU, softmax, dropout and the loss: 0
//   (element-wise, memory-bound: their time is not modelled).
//   So one layer's forward is 24 N h^2 + 4 b s^2 h, as in Narayanan et al.
//   2021 ("Efficient Large-Scale Language Model Training on GPU Clusters").
//
// Activation memory (non-model bytes on the accelerator), from Korthikanti
// et al. 2022 ("Reducing Activation Recomputation in Large Transformer
// Models", section 4): a layer without recomputation keeps
//   s b h (34 + 5 a s / h) bytes with 16-bit activations and 1-byte dropout
// masks.  Here tensors take `dtype_bytes` per element and masks 1 byte, so
// with dtype_bytes = 2 the figure is exactly theirs.  It is split over the
// uses where the tensors are saved (T = s b h dtype_bytes, M = s b h mask
// bytes, A = a s^2 b dtype_bytes, AM = a s^2 b mask bytes):
//   ln1: its input (the layer input, T: produced by the previous use)
//   qkv + attention core: qkv input T, Q and K 2T, V T, softmax output A,
//     its dropout mask AM, dropout output A
//   attention projection: input T, dropout mask M
//   ln2: input T
//   fc + GeLU: fc input T, GeLU input 4T
//   MLP projection: input 4T, dropout mask M; and its output T, the next
//     layer's input
//   = 16 T + 2 M + 2 A + AM per layer.
// With activation checkpointing only each layer's input T stays after the
// layer's forward; a layer's full activations exist again during its
// recompute and are freed use by use during its backward.  Not counted:
// the embedding dropout mask.  Head: ln_f keeps its input, the head its
// input T and the logits s b V logits_bytes (logits_bytes = 4: the loss is
// computed in fp32), from the head's forward to the end of its backward.
// Workspace (an assumption of this model, not Korthikanti's): every forward
// or recompute use also holds max(4T, A) (the MLP's intermediate output or
// the attention scores being produced); every backward use holds T (the
// gradient of the residual stream) plus max(4T, A) (the largest
// intermediate gradient).
// A use's `nonmodel_bytes` is what it holds while it computes: saved
// activations including its own, plus the workspace.  The caller reports
// that before acquiring the use's parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pstar::workload {

// The model family: a GPT (as above), or a ViT (torchvision's
// VisionTransformer): the same layers; a patch projection (conv_proj, a
// [hidden, channels, patch, patch] weight and a bias), a class token
// [1, 1, h] and a position embedding [1, seq, h] registered outside any
// submodule, where seq = patches + 1; a final LayerNorm and a classifier head
// [classes, h] with a bias, not tied.  Its schedule: conv_proj, class token,
// position embedding, layers, LayerNorm, head; backward in reverse.  The
// head's FLOPs count the class token's row only; its logits are batch x
// classes.  conv_proj: 2 h (channels patch^2) FLOPs per patch.  Its
// attention is one use of four parameters (qkv and output projection,
// weights and biases), as nn.MultiheadAttention makes one call of them.
enum class ModelKind { kGpt, kVit };

struct GptShape {
  ModelKind kind = ModelKind::kGpt;
  uint32_t layers = 0;
  uint32_t hidden = 0;
  uint32_t heads = 0;
  uint32_t vocab = 0;
  uint32_t seq = 0;
  uint32_t batch = 0;         // micro-batch per rank
  bool checkpointing = true;  // full activation checkpointing per layer
  uint32_t dtype_bytes = 2;   // compute dtype and activations: 2 or 4
  uint32_t logits_bytes = 4;  // bytes per logit kept for the loss
  // ViT only.
  uint32_t patch = 0;
  uint32_t channels = 0;
  uint32_t classes = 0;
};

// Empty when the shape is usable; otherwise what is wrong with it.
std::string validate(const GptShape& shape);

enum class Stage { Forward, Backward, Recompute };

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  bool no_weight_decay = false;
};

struct Use {
  std::vector<uint32_t> params;  // indices into Workload::params, acquired together
  Stage stage = Stage::Forward;
  double flops = 0.0;
  uint64_t nonmodel_bytes = 0;  // activations + workspace held during the use
  bool grad_write = false;      // backward: one gradient per parameter before release
};

struct Workload {
  GptShape shape;
  std::vector<Param> params;   // registration order = first-use order
  std::vector<Use> schedule;   // one TRAIN iteration
  uint64_t param_elems = 0;    // sum of numel (the tied wte once)
  double flops_forward = 0.0;  // per iteration, per rank
  double flops_backward = 0.0;
  double flops_recompute = 0.0;
  uint64_t peak_nonmodel_bytes = 0;
  uint64_t moments = 0;  // acquires per iteration

  double flops_total() const { return flops_forward + flops_backward + flops_recompute; }
};

// Parameters of the shape, closed form (the sum Workload::param_elems).
uint64_t gpt_param_count(const GptShape& shape);

// Korthikanti et al.'s per-layer activation bytes without recomputation,
// generalised to dtype_bytes (16 T + 2 M + 2 A + AM in the notation above).
uint64_t layer_activation_bytes(const GptShape& shape);

// Builds the parameter list and the schedule.  Throws std::invalid_argument
// when validate() reports a problem, or the shape is of the other kind.
Workload make_gpt(const GptShape& shape);
Workload make_vit(const GptShape& shape);
// make_gpt or make_vit, by shape.kind.
Workload make_workload(const GptShape& shape);

}  // namespace pstar::workload
