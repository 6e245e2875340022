#include "backend/rope.h"

#include <cmath>

#include "common/check.h"

namespace oasis {

RopeParams ComputeRopeParams(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  OASIS_CHECK(dim > 0 && dim % 2 == 0) << "head_dim must be even, got " << dim;
  RopeParams p;
  p.inv_freq.resize(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    // HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    p.inv_freq[static_cast<size_t>(i)] =
        1.0f /
        static_cast<float>(std::pow(static_cast<double>(static_cast<float>(config.rope_theta)),
                                    static_cast<double>(exponent)));
  }
  if (config.rope_scaling.type == RopeScalingType::kLlama3) {
    const RopeScaling& s = config.rope_scaling;
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / s.low_freq_factor;
    const double high_freq_wavelen = old_len / s.high_freq_factor;
    for (float& f : p.inv_freq) {
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
  return p;
}

}  // namespace oasis
