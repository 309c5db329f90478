// The one per-element Adam/AdamW update, shared by every CPU path and the
// CUDA kernel (DESIGN.md section 5).
//
// It is written with explicit fmaf and compiled without contraction
// (-ffp-contract=off, nvcc --fmad=false), IEEE division and square root, so
// that every implementation gives the same bits.  The constants that depend
// on the step only (bias corrections, the gradient multiplier that folds
// unscaling and clipping) are computed once per step by adam_constants(),
// in double and then rounded to float, the same way for every path.
#pragma once

#include <cmath>
#include <cstdint>

#include "util/host_device.h"

namespace pstar::optim {

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw = true;
};

// Per-step constants.
struct AdamStepConstants {
  float grad_mul;  // 1 / (loss_scale) * clip_coef
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float sqrt_bc2;      // sqrt(1 - beta2^t) (adam_element_int8)
  float eps;
  float l2;         // weight decay added to the gradient (Adam), else 0
  float decay_mul;  // 1 - lr * weight_decay (AdamW), else 1
};

// `step` is the 1-based step count after this update.  `decay` says whether
// this parameter takes weight decay.
inline AdamStepConstants adam_constants(const AdamHyper& h, uint64_t step, double grad_mul, bool decay) {
  AdamStepConstants c;
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  c.grad_mul = static_cast<float>(grad_mul);
  c.beta1 = h.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  c.beta2 = h.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  c.step_size = static_cast<float>(static_cast<double>(h.lr) / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  c.eps = h.eps;
  const float wd = decay ? h.weight_decay : 0.0f;
  c.l2 = h.adamw ? 0.0f : wd;
  c.decay_mul = h.adamw ? static_cast<float>(1.0 - static_cast<double>(h.lr) * static_cast<double>(wd)) : 1.0f;
  return c;
}

// Updates one element: master weight p, moments m and v, from gradient g as
// stored (scaled).  Returns the new master weight.
PSTAR_HD float adam_element(const AdamStepConstants& c, float g_stored, float& p, float& m, float& v) {
  float g = g_stored * c.grad_mul;
  g = fmaf(c.l2, p, g);
  m = fmaf(c.beta1, m, c.one_minus_beta1 * g);
  v = fmaf(c.beta2, v, (c.one_minus_beta2 * g) * g);
  const float denom = fmaf(sqrtf(v), c.inv_sqrt_bc2, c.eps);
  p = p * c.decay_mul;
  p = fmaf(-c.step_size, m / denom, p);
  return p;
}

// The int8 state format's update: adam_element()'s algorithm with the order
// of operations of bitsandbytes' blockwise AdamW8bit on the CPU
// (backends/cpu/ops.py, _optimizer_update_8bit_blockwise_cpu: torch's
// add_ with alpha and addcmul_ are fused multiply-adds there, the division
// by the bias correction a division, addcdiv_ (value * m) / denom), so that
// the int8 format's masters are bitsandbytes' to the rounding of torch's
// square root (tests/optim/test_bnb_pin.py).  It costs one division more
// than adam_element().  Every path of the format (scalar, AVX2, AVX-512,
// CUDA) performs these operations in this order.
PSTAR_HD float adam_element_int8(const AdamStepConstants& c, float g_stored, float& p, float& m, float& v) {
  float g = g_stored * c.grad_mul;
  g = fmaf(c.l2, p, g);
  m = fmaf(g, c.one_minus_beta1, m * c.beta1);
  v = fmaf(c.one_minus_beta2 * g, g, v * c.beta2);
  const float denom = sqrtf(v) / c.sqrt_bc2 + c.eps;
  p = p * c.decay_mul;
  p = p + (-c.step_size * m) / denom;
  return p;
}

}  // namespace pstar::optim
