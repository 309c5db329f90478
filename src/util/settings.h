// Checks of floating-point settings (Adam's hyperparameters, loss-scaler
// factors, learning-rate scales), shared by the options' validation
// (capi/options.cpp) and the engine's setters (pstar_hparam_set,
// pstar_param_set_lr_scale), so that a value means the same wherever it is
// set.  Settings are checked as stored, as floats; the bounds are floats
// too, so that a bound itself is accepted wherever it comes from.
#pragma once

#include <cstdint>
#include <string>

namespace pstar::settings {

constexpr float kMax = 1e30f;                 // lr, weight_decay, clip_norm, lr_scale, eps
constexpr float kBelowOne = 1.0f - 0x1p-24f;  // the largest float below 1 (betas)
constexpr const char* kRangeLr = "finite and in [0, 1e30]";
constexpr const char* kRangeBeta = "in [0, 1)";
constexpr const char* kRangeEps = "in [FLT_MIN, 1e30] (a normal float > 0)";
constexpr const char* kRangeScale = "in [FLT_MIN, FLT_MAX] (a normal float > 0)";
constexpr const char* kRangeDecay = "finite and in [0, 1e30]";
constexpr const char* kRangeClip = "in [0, 1e30] (0 = off)";

// Throws PSTAR_ERR_INVALID_ARGUMENT unless lo <= v <= hi (NaN never is);
// `range` says it for the message.
void require_float(float v, float lo, float hi, const char* what, const char* range);
// The same for a double that is stored as a float: the float is checked
// and returned, and the message says what the value rounded to.
float require_double_as_float(double v, float lo, float hi, const char* what, const char* range);

}  // namespace pstar::settings
