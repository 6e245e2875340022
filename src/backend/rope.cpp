#include "backend/rope.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace oasis {
namespace {

// HF: base ** (arange(0, dim, 2).float() / dim), in float32.
float PosFreq(double base, int64_t i, int64_t dim) {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
  return static_cast<float>(
      std::pow(static_cast<double>(static_cast<float>(base)), static_cast<double>(exponent)));
}

void ApplyLlama3(const RopeScaling& s, std::vector<float>& inv_freq) {
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / s.low_freq_factor;
  const double high_freq_wavelen = old_len / s.high_freq_factor;
  for (float& f : inv_freq) {
    const double wavelen = 2.0 * M_PI / f;
    const float scaled = wavelen > low_freq_wavelen ? static_cast<float>(f / s.factor) : f;
    if (wavelen < high_freq_wavelen || wavelen > low_freq_wavelen) {
      f = scaled;
    } else {  // medium frequencies: interpolate
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = static_cast<float>((1.0 - smooth) * scaled / s.factor + smooth * scaled);
    }
  }
}

double YarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// transformers' _compute_yarn_parameters; returns the attention scaling.
float ApplyYarn(const RopeScaling& s, double base, int64_t dim, std::vector<float>& inv_freq) {
  // The dimension whose wavelength makes `rotations` turns in the original context.
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) *
           std::log(static_cast<double>(s.original_max_position_embeddings) /
                    (rotations * 2 * M_PI)) /
           (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // as transformers: no singular ramp
  const float factor = static_cast<float>(s.factor);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float pos_freq = PosFreq(base, static_cast<int64_t>(i), dim);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp =
        std::clamp(static_cast<float>((static_cast<float>(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    inv_freq[i] =
        interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  if (s.attention_factor > 0) return static_cast<float>(s.attention_factor);
  if (s.mscale != 0 && s.mscale_all_dim != 0) {
    return static_cast<float>(YarnMscale(s.factor, s.mscale) /
                              YarnMscale(s.factor, s.mscale_all_dim));
  }
  return static_cast<float>(YarnMscale(s.factor, 1.0));
}

}  // namespace

RopeParams ComputeRopeParams(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  OASIS_CHECK(dim > 0 && dim % 2 == 0) << "head_dim must be even, got " << dim;
  const RopeScaling& s = config.rope_scaling;
  OASIS_CHECK(s.type != RopeScalingType::kDynamic || dim > 2) << "dynamic RoPE needs head_dim > 2";
  double base = config.rope_theta;
  if (s.type == RopeScalingType::kDynamic) {  // vLLM: the base at max_len = M · factor
    const double m = static_cast<double>(s.original_max_position_embeddings);
    const double max_len = m * s.factor;
    base *= std::pow(s.factor * max_len / m - (s.factor - 1),
                     static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  RopeParams p;
  p.inv_freq.resize(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i)
    p.inv_freq[static_cast<size_t>(i)] = 1.0f / PosFreq(base, i, dim);
  switch (s.type) {
    case RopeScalingType::kLlama3:
      ApplyLlama3(s, p.inv_freq);
      break;
    case RopeScalingType::kLinear:
      for (float& f : p.inv_freq) f /= static_cast<float>(s.factor);
      break;
    case RopeScalingType::kYarn:
      p.attention_scaling = ApplyYarn(s, base, dim, p.inv_freq);
      break;
    case RopeScalingType::kNone:
    case RopeScalingType::kDynamic:
      break;
  }
  return p;
}

}  // namespace oasis
